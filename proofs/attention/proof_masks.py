# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% [markdown]
# # How do masks work, and why −∞?
#
# Proofs for `docs/attention/masks.md`. Every measurement uses the shared module
# (`proofs/transformer/`) and flips one thing: `causal=` on or off, a
# `key_padding_mask` given or not, `cfg.mask_fill` ("-inf" or "min"), or
# `cfg.positions` ("sinusoidal" or "none"). The one variant the module does not
# offer, "set the masked logits to 0", is assembled below from the module's own
# `project`, `score`, `mix` and `w_o`.
# Run: `pytest proofs/attention/proof_masks.py`.

# %%
from __future__ import annotations

import torch

from proofs.tasks import PAD, padded_batch, random_tokens
from proofs.transformer import (DecoderLM, EncoderTagger, MultiHeadAttention, TransformerConfig, causal_mask,
                                record_attention)

VOCAB, T, BATCH = 16, 8, 16


def tiny_cfg(**switches) -> TransformerConfig:
    """A 2-layer model small enough that every measurement runs in milliseconds; dropout off (eval-exact)."""
    base = dict(vocab_size=VOCAB, d_model=32, n_heads=4, d_ff=64, n_layers=2, dropout_emb=0.0, dropout_residual=0.0)
    return TransformerConfig(**{**base, **switches})


# %% [markdown]
# ## 1. The causal mask: does output i see anything after i?
#
# Redraw every input after position i and look at the outputs up to i. With the mask
# they must not move at all; without it they do. The same probe runs on one
# `MultiHeadAttention` (on vectors) and on whole models (on token ids).

# %%
# --8<-- [start:future]
@torch.no_grad()
def future_change(f, x: torch.Tensor, fresh) -> dict:
    """For each i < T-1: redraw every input after i with fresh(), then measure
    up_to_i = max |Δ f(x)[:, :i+1]| (must be 0 under a causal mask) and at_i = max |Δ f(x)[:, i]|."""
    base = f(x)
    up_to_i, at_i = [], []
    for i in range(x.shape[1] - 1):
        other = x.clone()
        other[:, i + 1:] = fresh(other[:, i + 1:])
        out = f(other)
        up_to_i.append((out[:, : i + 1] - base[:, : i + 1]).abs().max().item())
        at_i.append((out[:, i] - base[:, i]).abs().max().item())
    return {"up_to_i": up_to_i, "at_i": at_i}


def new_tokens(g: torch.Generator):
    return lambda old: random_tokens(g, old.shape[0], old.shape[1], VOCAB)


def stack(model: EncoderTagger, causal: bool):
    """The same layers and weights, run with or without the causal mask (Encoder takes causal=)."""
    return lambda ids: model.head(model.encoder(model.embed(ids), causal=causal))
# --8<-- [end:future]


def causal_probe(seed: int) -> dict:
    """future_change for one attention module (fused and explicit paths) and for whole models."""
    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(seed)
    attn = MultiHeadAttention(tiny_cfg()).eval()
    x = torch.randn(BATCH, T, 32)
    out = {
        "mha_causal_fused": future_change(lambda v: attn(v, causal=True), x, torch.randn_like),
        "mha_no_mask": future_change(lambda v: attn(v), x, torch.randn_like),
    }
    with record_attention(attn):  # forces the explicit path: scores, masked_fill, softmax, weights kept
        out["mha_causal_explicit"] = future_change(lambda v: attn(v, causal=True), x, torch.randn_like)
        attn(x, causal=True)
        w = attn.weights  # (B, nh, T, T)
    above = causal_mask(T)  # True above the diagonal
    out["max_weight_above_diagonal"] = w[..., above].abs().max().item()
    out["min_weight_on_diagonal_or_below"] = w[..., ~above].min().item()
    out["weights"] = w[0, 0]
    ids = random_tokens(g, BATCH, T, VOCAB)
    lm = DecoderLM(tiny_cfg()).eval()
    out["decoder_lm"] = future_change(lm, ids, new_tokens(g))
    enc = EncoderTagger(tiny_cfg()).eval()
    out["stack_causal"] = future_change(stack(enc, True), ids, new_tokens(g))
    out["stack_no_mask"] = future_change(stack(enc, False), ids, new_tokens(g))
    return out


# %% [markdown]
# ## 2. Padding: do the real tokens' outputs depend on the padding?
#
# Right-padded sequences of lengths 3 to 8. Three batches that differ only in the
# padding: PAD tokens, random tokens in the padded slots, and four more padded
# columns. Compare the logits of the real tokens, with and without `key_padding_mask`.

# %%
# --8<-- [start:padding]
LENGTHS = [3, 5, 8, 6]


def padding_variants(seed: int, extra: int = 4) -> dict:
    """ids (PAD in the padding), the same with random tokens there, and with `extra` more PAD columns."""
    g = torch.Generator().manual_seed(seed)
    ids, pad = padded_batch(g, LENGTHS, T, VOCAB)
    junk = torch.where(pad, random_tokens(g, *ids.shape, VOCAB), ids)
    longer = torch.cat([ids, torch.full((len(LENGTHS), extra), PAD)], dim=1)
    return {"pad": (ids, pad), "junk": (junk, pad), "longer": (longer, longer == PAD)}


@torch.no_grad()
def padding_effect(model, seed: int, use_mask: bool) -> dict:
    """Largest change of the real tokens' logits when the padding's content or amount changes."""
    v = padding_variants(seed)
    run = {name: model(ids, pad if use_mask else None) for name, (ids, pad) in v.items()}
    real = ~v["pad"][1]  # (B, T) True at real tokens
    base = run["pad"][real]
    return {
        "content": (run["junk"][real] - base).abs().max().item(),
        "amount": (run["longer"][:, :T][real] - base).abs().max().item(),
        "pad_rows_content": (run["junk"][~real] - run["pad"][~real]).abs().max().item(),
    }
# --8<-- [end:padding]


def weight_on_padding(seed: int) -> float:
    """Total attention weight any query puts on a padded key, every layer, every head."""
    torch.manual_seed(seed)
    model = EncoderTagger(tiny_cfg()).eval()
    ids, pad = padding_variants(seed)["pad"]
    with torch.no_grad(), record_attention(model) as mods:
        model(ids, pad)
    return max(m.weights[pad[:, None, None, :].expand_as(m.weights)].abs().max().item() for m in mods)


# %% [markdown]
# ## 2b. Does a decoder need the padding mask?
#
# In a causal decoder the padding's place decides. Right padding sits after every real token,
# so the causal mask already hides it from them. Left padding (what batched generation uses, so
# that every sequence ends at the same column) sits before them, in plain view of the causal mask.
# Both decoders use `mask_fill="min"`: with left padding the first padding query sees nothing but
# padding, and −∞ would turn that row into NaN (section 4), which is a different question.

# %%
# --8<-- [start:decoder_padding]
def left_padded(seed: int) -> dict:
    """The LENGTHS sequences left-padded to T, and the same with random tokens in the padding."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.full((len(LENGTHS), T), PAD)
    for i, n in enumerate(LENGTHS):
        ids[i, T - n:] = torch.randint(1, VOCAB, (n,), generator=g)
    pad = ids == PAD
    junk = torch.where(pad, random_tokens(g, *ids.shape, VOCAB), ids)
    return {"pad": (ids, pad), "junk": (junk, pad)}


@torch.no_grad()
def decoder_padding_effect(seed: int, side: str, use_mask: bool) -> float:
    """Largest change of a causal DecoderLM's real-token logits when the padding's content changes
    (and, for right padding, also when four more padding columns are added)."""
    torch.manual_seed(seed)
    lm = DecoderLM(tiny_cfg(mask_fill="min")).eval()
    if side == "right":
        return max(padding_effect(lm, seed, use_mask)[k] for k in ("content", "amount"))
    v = left_padded(seed)
    (ids, pad), (junk, _) = v["pad"], v["junk"]
    real = ~pad
    base, other = lm(ids, pad if use_mask else None), lm(junk, pad if use_mask else None)
    return (other[real] - base[real]).abs().max().item()
# --8<-- [end:decoder_padding]


# %% [markdown]
# ## 3. Masked logits set to 0 instead of −∞
#
# The wrong variant, from the module's own pieces: `project`, `score`, the fill,
# softmax, `mix`, `w_o`. With fill = −∞ it reproduces `attn(x, causal=True)`; with
# fill = 0 every hidden key keeps a weight exp(0)/Z.

# %%
# --8<-- [start:fill]
def attend_with_fill(attn: MultiHeadAttention, x: torch.Tensor, hide: torch.Tensor, fill: float):
    """Self-attention of x whose hidden scores are overwritten with `fill` before the softmax."""
    q, k, v = attn.project(x, x)
    s = attn.score(q, k).masked_fill(hide, fill)  # (B, nh, T, T)
    a = torch.softmax(s, dim=-1)
    y = attn.mix(a, v).transpose(1, 2).reshape(x.shape)  # heads back to (B, T, C)
    return attn.w_o(y), a


@torch.no_grad()
def zero_fill_leak(seed: int) -> dict:
    torch.manual_seed(seed)
    attn = MultiHeadAttention(tiny_cfg()).eval()
    x = torch.randn(BATCH, T, 32)
    hide = causal_mask(T)
    y_inf, a_inf = attend_with_fill(attn, x, hide, float("-inf"))
    y_zero, a_zero = attend_with_fill(attn, x, hide, 0.0)
    future_mass = a_zero.masked_fill(~hide, 0).sum(-1)[..., :-1]  # (B, nh, T-1): weight on keys after i
    return {
        "matches_module": (y_inf - attn(x, causal=True)).abs().max().item(),
        "leak_mean": future_mass.mean().item(),
        "leak_row0": future_mass[..., 0].mean().item(),
        "leak_inf": a_inf.masked_fill(~hide, 0).sum(-1).max().item(),
        "zero": future_change(lambda v: attend_with_fill(attn, v, hide, 0.0)[0], x, torch.randn_like),
        "inf": future_change(lambda v: attend_with_fill(attn, v, hide, float("-inf"))[0], x, torch.randn_like),
        "weights": {"−∞ fill": a_inf[0, 0], "0 fill": a_zero[0, 0]},
    }
# --8<-- [end:fill]


# %% [markdown]
# ## 4. −∞ or the dtype's minimum?
#
# `cfg.mask_fill="min"` writes `torch.finfo(dtype).min` instead of −∞. On a row with
# at least one visible key both give exp(·) = 0 to the hidden keys. On a row where
# every key is hidden −∞ − (−∞) is NaN, while the minimum gives equal logits: a
# uniform average. A fully masked row happens with left padding under a causal mask:
# the first padding query sees only padding.

# %%
# --8<-- [start:min_fill]
def twin_heads(seed: int):
    """The same weights with mask_fill="-inf" and mask_fill="min"."""
    torch.manual_seed(seed)
    a = MultiHeadAttention(tiny_cfg()).eval()
    b = MultiHeadAttention(tiny_cfg(mask_fill="min")).eval()
    b.load_state_dict(a.state_dict())
    return a, b


@torch.no_grad()
def fill_comparison(seed: int) -> dict:
    inf, mn = twin_heads(seed)
    x = torch.randn(4, T, 32)
    with record_attention(inf):  # explicit softmax path for -inf too
        ordinary = (inf(x, causal=True) - mn(x, causal=True)).abs().max().item()
        pad = torch.zeros(4, T, dtype=torch.bool)
        pad[0] = True  # sequence 0 is all padding: each of its rows has no visible key
        y_inf = inf(x, key_padding_mask=pad)
    y_fused = inf(x, key_padding_mask=pad)  # F.scaled_dot_product_attention path
    y_min = mn(x, key_padding_mask=pad)
    _, _, v = mn.project(x, x)
    uniform = mn.w_o(v.mean(2, keepdim=True).expand_as(v).transpose(1, 2).reshape(x.shape))  # plain mean of values
    return {
        "ordinary_rows": ordinary,
        "nan_inf_explicit": y_inf[0].isnan().float().mean().item(),
        "nan_inf_fused": y_fused[0].isnan().float().mean().item(),
        "nan_min": y_min[0].isnan().float().mean().item(),
        "min_vs_uniform": (y_min[0] - uniform[0]).abs().max().item(),
        "other_rows_inf": (y_inf[1:] - y_min[1:]).abs().max().item(),
    }


@torch.no_grad()
def left_padded_decoder(seed: int, n_pad: int = 3) -> dict:
    """A 2-layer DecoderLM on left-padded sequences: fraction of REAL tokens' logits that are NaN."""
    torch.manual_seed(seed)
    lm_inf = DecoderLM(tiny_cfg()).eval()
    lm_min = DecoderLM(tiny_cfg(mask_fill="min")).eval()
    lm_min.load_state_dict(lm_inf.state_dict())
    g = torch.Generator().manual_seed(seed)
    ids = random_tokens(g, 4, T, VOCAB)
    ids[:, :n_pad] = PAD
    pad = ids == PAD
    with record_attention(lm_inf):
        explicit = lm_inf(ids, pad)
    out = {"-inf explicit": explicit, "-inf fused": lm_inf(ids, pad), "min": lm_min(ids, pad)}
    return {name: y[~pad].isnan().float().mean().item() for name, y in out.items()}
# --8<-- [end:min_fill]


# %% [markdown]
# ## 5. Without positions: permutation equivariance, and what the causal mask adds
#
# Permute the input tokens with π and compare f(π·x) with π·f(x). Equal means the
# model cannot tell the order (each token's output depends on the set of tokens, not
# on where they sit).

# %%
# --8<-- [start:perm]
@torch.no_grad()
def permutation_gap(model, seed: int) -> dict:
    """max |f(x[π]) − f(x)[π]| relative to max |f(x)|, and the same for the mean over positions."""
    g = torch.Generator().manual_seed(seed)
    ids = random_tokens(g, BATCH, T, VOCAB)
    perm = torch.randperm(T, generator=g)
    while bool((perm == torch.arange(T)).all()):
        perm = torch.randperm(T, generator=g)
    y, y_perm = model(ids), model(ids[:, perm])
    scale = y.abs().max().item()
    return {
        "per_token": (y_perm - y[:, perm]).abs().max().item() / scale,
        "pooled": (y_perm.mean(1) - y.mean(1)).abs().max().item() / scale,
    }


def built(cls, seed: int, **switches):
    torch.manual_seed(seed)
    return cls(tiny_cfg(**switches)).eval()
# --8<-- [end:perm]


@torch.no_grad()
def prefix_shuffle_gap(seed: int, n_layers: int) -> float:
    """Causal LM, no positions: change of the LAST output when the tokens before it are shuffled."""
    lm = built(DecoderLM, seed, positions="none", n_layers=n_layers)
    g = torch.Generator().manual_seed(seed)
    ids = random_tokens(g, BATCH, T, VOCAB)
    perm = torch.cat([torch.randperm(T - 1, generator=g), torch.tensor([T - 1])])
    y = lm(ids)
    return ((lm(ids[:, perm])[:, -1] - y[:, -1]).abs().max() / y.abs().max()).item()


# %%
if __name__ == "__main__":
    p = causal_probe(0)
    print({k: max(v["up_to_i"]) for k, v in p.items() if isinstance(v, dict)})
    lm_cfg = EncoderTagger(tiny_cfg()).eval()
    print(padding_effect(lm_cfg, 0, True), padding_effect(lm_cfg, 0, False))
    print({k: v for k, v in zero_fill_leak(0).items() if k not in ("zero", "inf", "weights")})
    print(fill_comparison(0), left_padded_decoder(0))
    print(permutation_gap(built(EncoderTagger, 0, positions="none"), 0))


# %% [markdown]
# ## Tests

# %%
import pytest  # noqa: E402


def _plot_weights(ev, panels: dict, name: str, caption: str):
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(panels), figsize=(3.6 * len(panels), 3.2), constrained_layout=True)
    for ax, (title, w) in zip(axes, panels.items()):
        im = ax.imshow(w.numpy(), vmin=0, vmax=1, cmap="viridis")
        ax.set(title=title, xlabel="key j", xticks=range(T), yticks=range(T))
        for i in range(T):
            for j in range(i + 1, T):  # the hidden keys: print their weight (exact zeros as "0")
                v = w[i, j].item()
                ax.text(j, i, "0" if v == 0 else f"{v:.2f}", ha="center", va="center", fontsize=6, color="white")
    axes[0].set_ylabel("query i")
    fig.colorbar(im, ax=list(axes), shrink=0.8, label="softmax weight")
    ev.figure(fig, name, caption)


# --8<-- [start:test_causal]
@pytest.mark.claim("C-MASK-1", "confirmed")
def test_causal_mask_hides_the_future_exactly(ev, seed):
    """With causal=True no output up to i moves when every input after i is redrawn, for every i, in one
    attention module and in whole models (exact: a property of our module's masking, checked bit for bit);
    without the mask every position's output moves. Would be refuted if any output up to i moved by any amount."""
    p = causal_probe(seed)
    for name, what in (("mha_causal_fused", "one MultiHeadAttention, causal, fused SDPA path"),
                       ("mha_causal_explicit", "one MultiHeadAttention, causal, explicit −∞ path"),
                       ("decoder_lm", "DecoderLM (2 layers)"),
                       ("stack_causal", "2-layer stack, causal=True")):
        ev.record(f"max |Δ outputs ≤ i| over all i, {what}", max(p[name]["up_to_i"]), expect="0 exactly")
        assert max(p[name]["up_to_i"]) == 0.0
    for name, what in (("mha_no_mask", "one MultiHeadAttention"), ("stack_no_mask", "2-layer stack")):
        ev.record(f"smallest over i of max |Δ output i|, no mask, {what}", min(p[name]["at_i"]),
                  expect="> 0 for every i: the past sees the future")
        # over seeds 100-139: one module 0.23 ± 0.04 (min 0.16), 2-layer stack 0.83 ± 0.23 (min 0.48): 1e-3 is
        # more than a factor 100 below every value (magnitudes, skewed: the factor is the margin that counts)
        assert min(p[name]["at_i"]) > 1e-3
    ev.record("largest softmax weight above the diagonal (causal, recorded)", p["max_weight_above_diagonal"],
              expect="0 exactly")
    ev.record("smallest weight on or below the diagonal", p["min_weight_on_diagonal_or_below"], expect="> 0",
              key=False)
    assert p["max_weight_above_diagonal"] == 0.0 and p["min_weight_on_diagonal_or_below"] > 0
# --8<-- [end:test_causal]


# --8<-- [start:test_padding]
@pytest.mark.claim("C-MASK-2", "nuanced")
def test_padding_mask_makes_real_outputs_independent_of_padding(ev, seed):
    """Encoder: with key_padding_mask the real tokens' logits do not depend on what the padding is or how much there
    is (up to float rounding); without it they do. This is the side of C-MASK-2 that holds. Would be refuted if the
    masked real logits moved, or if the unmasked ones did not (then the mask would be unnecessary here)."""
    torch.manual_seed(seed)
    model = EncoderTagger(tiny_cfg()).eval()
    masked, unmasked = padding_effect(model, seed, True), padding_effect(model, seed, False)
    ev.record("max |Δ real logits|, padding content changed, with mask", masked["content"], expect="0 (float noise)")
    ev.record("max |Δ real logits|, 4 more padding columns, with mask", masked["amount"], expect="0 (float noise)")
    ev.record("max |Δ real logits|, padding content changed, no mask", unmasked["content"], expect="of order 1")
    ev.record("max |Δ real logits|, 4 more padding columns, no mask", unmasked["amount"], expect="of order 1")
    w = weight_on_padding(seed)
    ev.record("largest attention weight on a padded key (every layer, head)", w, expect="0 exactly")
    assert masked["content"] < 1e-5 and masked["amount"] < 1e-5
    # over seeds 100-139: no mask, content 1.64 ± 0.50 (min 0.90), amount 1.13 ± 0.48 (min 0.42); 0.1 is a factor
    # 4 below the smallest (magnitudes, skewed: the factor is the margin that counts); with the mask exactly 0
    assert unmasked["content"] > 0.1 and unmasked["amount"] > 0.1
    assert w == 0.0
# --8<-- [end:test_padding]


def test_what_the_padding_mask_does_not_protect(ev, seed):
    """The mask protects real tokens inside attention only: the padding rows' own outputs are garbage, and a
    BatchNorm computed over every token lets the amount of padding back in. Would be wrong if the padding rows
    stayed fixed or BatchNorm kept the real logits fixed."""
    torch.manual_seed(seed)
    enc = EncoderTagger(tiny_cfg()).eval()
    ln = padding_effect(enc, seed, True)
    ev.record("max |Δ padding rows' own logits|, padding content changed, with mask", ln["pad_rows_content"],
              expect="> 0: padding outputs are garbage, keep them out of the loss")
    assert ln["pad_rows_content"] > 0.1  # over seeds 100-139: 3.5 ± 0.8 (min 1.9)
    # BatchNorm in training mode: batch statistics over all B·T tokens, padding included
    arms = {}
    for norm in ("layer", "batch"):
        torch.manual_seed(seed)
        m = EncoderTagger(tiny_cfg(norm=norm)).train()  # dropout is 0: train() only switches BatchNorm's stats
        arms[norm] = padding_effect(m, seed, True)
    ev.record("max |Δ real logits|, 4 more padding columns, mask + LayerNorm (train mode)", arms["layer"]["amount"],
              expect="0 (float noise)")
    ev.record("max |Δ real logits|, 4 more padding columns, mask + BatchNorm (train mode)", arms["batch"]["amount"],
              expect="> 0: the norm mixes the padding back in")
    assert arms["layer"]["amount"] < 1e-5 and arms["batch"]["amount"] > 0.05  # BatchNorm: 1.15 ± 0.24 (min 0.77)


# --8<-- [start:test_decoder_padding]
@pytest.mark.claim("C-MASK-2", "nuanced")
def test_whether_a_decoder_needs_the_padding_mask_depends_on_the_side(ev, seed):
    """Causal DecoderLM: with left padding the real tokens' logits move when the padding changes unless it is masked;
    with right padding they do not move at all without any padding mask, because the causal mask already hides
    trailing padding (exact). So "padding must be masked" holds for encoders and left padding, not for a
    right-padded decoder's real tokens. Would be confirmed as stated if the right-padded real logits moved without
    the mask; refuted if the left-padded ones did not."""
    left = {m: decoder_padding_effect(seed, "left", m) for m in (True, False)}
    right = {m: decoder_padding_effect(seed, "right", m) for m in (True, False)}
    ev.record("max |Δ real logits|, left-padded DecoderLM, padding content changed, with mask", left[True],
              expect="0 (float noise)")
    ev.record("max |Δ real logits|, left-padded DecoderLM, padding content changed, NO mask", left[False],
              expect="of order 1: the mask is needed")
    ev.record("max |Δ real logits|, right-padded DecoderLM, padding content or amount changed, NO mask", right[False],
              expect="0: the causal mask hides trailing padding")
    ev.record("max |Δ real logits|, right-padded DecoderLM, with mask", right[True], expect="0 (float noise)",
              key=False)
    assert left[True] < 1e-5 and right[True] < 1e-5 and right[False] < 1e-5
    assert left[False] > 0.1  # over seeds 100-139: 2.19 ± 0.56 (min 1.20), a factor 12 above 0.1; the rest exactly 0
# --8<-- [end:test_decoder_padding]


# --8<-- [start:test_zero_fill]
@pytest.mark.claim("C-FOLK-11", "refuted")
def test_zero_filled_logits_leak_the_future(ev, seed):
    """A masked logit set to 0 keeps the weight exp(0)/Z: the future leaks into every row. −∞ gives it exactly 0.
    Would be refuted (the folk answer right) if the 0-filled rows put no weight on future keys."""
    r = zero_fill_leak(seed)
    ev.record("max |Δ| between the −∞ rebuild and attn(x, causal=True)", r["matches_module"],
              expect="0 (float noise): the rebuild is the module", key=False)
    ev.record("mean weight on future keys per row, 0 fill", r["leak_mean"], expect="> 0: a leak")
    ev.record("mean weight on future keys in row 0, 0 fill", r["leak_row0"], expect="most of the row (7 hidden keys vs 1)")
    ev.record("largest weight on future keys per row, −∞ fill", r["leak_inf"], expect="0 exactly")
    ev.record("smallest over i of max |Δ output i| when the future changes, 0 fill", min(r["zero"]["at_i"]),
              expect="> 0 for every i")
    ev.record("max |Δ outputs ≤ i| when the future changes, −∞ fill", max(r["inf"]["up_to_i"]), expect="0 exactly")
    _plot_weights(ev, r["weights"], "fill", "Softmax weights of one head (query i, key j), causal mask filled with −∞ "
                  "and with 0; numbers above the diagonal are the weights that should be 0.")
    assert r["matches_module"] < 1e-6
    assert r["leak_inf"] == 0.0 and max(r["inf"]["up_to_i"]) == 0.0
    # over seeds 100-139: leak per row 0.492 ± 0.003, in row 0 0.871 ± 0.007, smallest output change 0.19 ± 0.02
    assert r["leak_mean"] > 0.2 and r["leak_row0"] > 0.5
    assert min(r["zero"]["at_i"]) > 1e-3
# --8<-- [end:test_zero_fill]


@pytest.mark.claim("C-FOLK-11", "refuted")
def test_minus_inf_and_dtype_min_differ_only_on_fully_masked_rows(ev, seed):
    """−∞ and the dtype's minimum give identical outputs whenever a row has a visible key; on a fully masked row −∞
    gives NaN (explicit softmax) and the minimum a uniform average. With left padding and a causal mask that NaN
    reaches the real tokens one layer later (0 · NaN = NaN). Exact arithmetic of our module's two fills. Would be
    refuted if the two fills differed on a row with a visible key, or agreed on a fully masked one."""
    r = fill_comparison(seed)
    ev.record("max |Δ output|, −∞ vs min, causal rows", r["ordinary_rows"], expect="0 exactly")
    ev.record("max |Δ output|, −∞ vs min, sequences with real tokens", r["other_rows_inf"], expect="0 exactly",
              key=False)
    ev.record("fraction NaN, all-padding sequence, −∞, explicit softmax", r["nan_inf_explicit"], expect="1")
    ev.record("fraction NaN, all-padding sequence, −∞, fused SDPA (this torch)", r["nan_inf_fused"])
    ev.record("fraction NaN, all-padding sequence, min", r["nan_min"], expect="0")
    ev.record("max |min-fill output − plain mean of the values|, all-padding sequence", r["min_vs_uniform"],
              expect="0 (float noise): a uniform average")
    d = left_padded_decoder(seed)
    for name, frac in d.items():
        ev.record(f"fraction of REAL tokens' logits that are NaN, left-padded 2-layer DecoderLM, {name}", frac)
    assert r["ordinary_rows"] == 0.0 and r["other_rows_inf"] == 0.0
    assert r["nan_inf_explicit"] == 1.0 and r["nan_min"] == 0.0 and r["min_vs_uniform"] < 1e-5
    assert d["-inf explicit"] == 1.0 and d["min"] == 0.0


# --8<-- [start:test_perm]
@pytest.mark.claim("C-PERM-1", "nuanced")
def test_without_positions_the_encoder_is_permutation_equivariant_but_not_the_decoder(ev, seed):
    """positions="none": permuting the tokens permutes the encoder's outputs the same way (up to float rounding);
    sinusoids break that, and so does the causal mask in a decoder without any positions. Would be confirmed as
    stated ("ignores order") if the causal decoder were equivariant too, refuted if the encoder were not."""
    enc_none = permutation_gap(built(EncoderTagger, seed, positions="none"), seed)
    enc_sin = permutation_gap(built(EncoderTagger, seed, positions="sinusoidal"), seed)
    dec_none = permutation_gap(built(DecoderLM, seed, positions="none"), seed)
    ev.record("max |f(πx) − πf(x)| / max |f(x)|, encoder, no positions", enc_none["per_token"],
              expect="0 (float noise): equivariant")
    ev.record("same, encoder, sinusoidal positions", enc_sin["per_token"], expect="of order 1")
    ev.record("same, causal DecoderLM, no positions", dec_none["per_token"], expect="of order 1: the mask carries order")
    ev.record("mean over positions, |Δ| / max |f(x)|, encoder, no positions", enc_none["pooled"],
              expect="0 (float noise): a pooled output is invariant", key=False)
    one, two = prefix_shuffle_gap(seed, 1), prefix_shuffle_gap(seed, 2)
    ev.record("last output of a no-position DecoderLM when the earlier tokens are shuffled, 1 layer", one,
              expect="0 (float noise): one layer sees a set", key=False)
    ev.record("same, 2 layers", two, expect="> 0: the second layer sees the order", key=False)
    # over seeds 100-139: encoder without positions 2.6e-7 ± 0.5e-7 (float rounding); with sinusoids 0.37 ± 0.08
    # (min 0.19); causal decoder 0.72 ± 0.14 (min 0.47); prefix shuffle, 2 layers 0.20 ± 0.07 (min 0.09)
    assert enc_none["per_token"] < 1e-5 and enc_none["pooled"] < 1e-5
    assert enc_sin["per_token"] > 0.05 and dec_none["per_token"] > 0.1
    assert one < 1e-5 and two > 1e-3
# --8<-- [end:test_perm]
