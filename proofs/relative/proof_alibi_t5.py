# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% [markdown]
# # ALiBi and T5's bucketed bias: what exactly is added?
#
# Proofs for the page `docs/relative/alibi-and-t5.md`. Both schemes add a number to each
# attention logit that depends on the offset j − i and the head, and nothing else:
#
# - `positions="alibi"`: −m_h·|i − j|, a fixed slope per head (Press et al. 2022, §3);
# - `positions="t5"`: a learned scalar per head and per offset *bucket* (Raffel et al. 2020,
#   §2.1), buckets exact for small offsets, log-spaced after, one shared bucket for the far ones.
#
# In the shared module both override one hook, `bias`, which the fused
# (`F.scaled_dot_product_attention`) and tiled paths take as a float mask. Run it with
# `pytest proofs/relative/proof_alibi_t5.py`.

# %%
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from proofs.length_runs import TRAIN_LEN, trained
from proofs.transformer import (
    ALiBiAttention,
    DecoderLM,
    EncoderTagger,
    MultiHeadAttention,
    ShawAttention,
    T5BiasAttention,
    TransformerConfig,
    alibi_slopes,
    t5_bucket,
)

CFG = TransformerConfig(d_model=32, n_heads=4, dropout_emb=0.0, dropout_residual=0.0)


# %% [markdown]
# ## 1. ALiBi: the bias, the slopes, and nothing else
#
# The slopes of Press et al. §3: for n heads a power of two, the geometric sequence that
# starts at 2^(−8/n) with that same ratio (8 heads: 1/2, 1/4, ..., 1/256); otherwise the n' =
# 2^⌊log2 n⌋ slopes of the nearest smaller power of two, then every other slope of 2n' heads
# (their code's rule). The module's bias is compared with −m_h·(i − j) written out, and the
# ALiBi attention with a plain attention (positions="none", same weights) plus that bias.

# %%
# --8<-- [start:alibi]
def paper_slopes(n: int) -> list[float]:
    """Press et al. §3 and their get_slopes: geometric from 2^(-8/n); non-powers of two interleave 2n's."""
    if math.log2(n).is_integer():
        return [2.0 ** (-8.0 * (h + 1) / n) for h in range(n)]
    p = 2 ** math.floor(math.log2(n))
    return paper_slopes(p) + paper_slopes(2 * p)[0::2][: n - p]


def alibi_checks(seed: int, T: int = 9) -> dict:
    torch.manual_seed(seed)
    alibi = ALiBiAttention(CFG.replace(positions="alibi", attn_impl="explicit")).double().eval()
    plain = MultiHeadAttention(CFG.replace(positions="none", attn_impl="explicit")).double().eval()
    plain.load_state_dict(alibi.state_dict())  # ALiBi has no parameter of its own: the same state dict
    pos = torch.arange(T)[None]
    i, j = pos[0, :, None], pos[0, None, :]
    m = torch.tensor(paper_slopes(4), dtype=torch.float64)
    formula = -m[:, None, None] * (i - j).abs()  # (nh, T, T); a causal query only sees j <= i: -m(i - j)
    x = torch.randn(2, T, CFG.d_model, dtype=torch.float64)
    q, k, v = plain.project(x, x)
    logits = (q @ k.transpose(-2, -1) / math.sqrt(alibi.d_head) + formula).masked_fill(j > i, float("-inf"))
    by_hand = alibi.w_o((torch.softmax(logits, -1) @ v).transpose(1, 2).reshape(x.shape))
    return {
        "bias vs formula": (alibi.bias(pos, pos)[0].double() - formula).abs().max().item(),
        "alibi vs plain + bias": (alibi(x, causal=True) - by_hand).abs().max().item(),
        "alibi vs plain": (alibi(x, causal=True) - plain(x, causal=True)).abs().max().item(),
        "extra state": sorted(set(alibi.state_dict()) ^ set(plain.state_dict())),
    }


def position_parameters(positions: str) -> int:
    """Parameters and persistent buffers of a DecoderLM beyond those of the same model with positions="none"."""
    def count(p: str) -> int:
        with torch.device("meta"):
            return sum(t.numel() for t in DecoderLM(CFG.replace(positions=p, max_len=512)).state_dict().values())
    return count(positions) - count("none")
# --8<-- [end:alibi]


# %% [markdown]
# ## 2. T5: the bucket map, the parameters, the far offsets
#
# The bucket of a key−query offset, for T5's own setting (32 buckets, offsets up to 128) in
# a causal layer: 16 exact buckets for distances 0..15, 16 log-spaced ones for 16..127;
# everything farther shares the last. Each bucket holds one learned scalar per head, so a
# layer adds buckets × heads numbers (T5 shares one table across its layers; here each
# layer has its own). Past the largest bucket every offset gets the same scalar: the checks
# below read it at distances 200, 1000 and 100 000.

# %%
# --8<-- [start:t5]
def t5_reference(distance: int, n_buckets: int = 32, max_distance: int = 128) -> int:
    """Causal bucket of a key `distance` tokens back, in plain Python (T5's _relative_position_bucket)."""
    exact = n_buckets // 2
    if distance < exact:
        return distance
    log_part = math.log(distance / exact) / math.log(max_distance / exact) * (n_buckets - exact)
    return min(exact + int(log_part), n_buckets - 1)


def t5_checks(seed: int) -> dict:
    back = torch.arange(0, 100_001)
    buckets = t5_bucket(-back, bidirectional=False)  # the defaults: 32 buckets, max distance 128
    ref = torch.tensor([t5_reference(d) for d in range(0, 1001)])
    torch.manual_seed(seed)
    attn = T5BiasAttention(CFG.replace(positions="t5"))
    attn.causal = True  # as in a decoder's forward(causal=True): keys before the query use all 32 buckets
    with torch.no_grad():
        attn.rel_bias.normal_()  # a table as after training: any values
    q_pos, k_pos = torch.tensor([[100_000]]), torch.tensor([[100_000 - 200, 100_000 - 1000, 0]])
    far = attn.bias(q_pos, k_pos)[0, :, 0]  # (nh, 3): the bias of keys 200, 1000, 100000 back
    first_last = int((buckets == 31).nonzero()[0])
    return {
        "module vs reference, distances 0..1000": int((buckets[:1001] != ref).sum()),
        "exact buckets": buckets[:16].tolist(),
        "first distance in the last bucket": first_last,
        "buckets used": int(buckets.unique().numel()),
        "far scalars differ (max over heads)": (far - far[:, :1]).abs().max().item(),
        "far scalar equals table row 31": bool(torch.equal(far[:, 0], attn.rel_bias[31])),
        "parameters per layer": sum(p.numel() for p in attn.parameters()) - sum(
            p.numel() for p in MultiHeadAttention(CFG).parameters()),
    }
# --8<-- [end:t5]


def t5_reference_bidirectional(offset: int, n_buckets: int = 32, max_distance: int = 128) -> int:
    """Bidirectional bucket of a key−query offset in plain Python (T5's rule for its encoder): half the buckets each
    way, the upper half for keys after the query, the same exact-then-log rule on |offset| within a half."""
    half = n_buckets // 2
    upper = half if offset > 0 else 0
    dist, exact = abs(offset), half // 2
    if dist < exact:
        return upper + dist
    return upper + min(exact + int(math.log(dist / exact) / math.log(max_distance / exact) * (half - exact)), half - 1)


@torch.no_grad()
def t5_encoder_checks(seed: int) -> dict:
    """Bidirectional buckets against the plain-Python rule for offsets −1000..1000, and the bias an encoder layer of a
    built EncoderTagger actually adds (after its own forward pass) for the keys just after and just before a query."""
    offsets = torch.arange(-1000, 1001)
    ref = torch.tensor([t5_reference_bidirectional(int(o)) for o in offsets])
    torch.manual_seed(seed)
    tagger = EncoderTagger(CFG.replace(vocab_size=16, n_layers=1, positions="t5")).eval()
    attn = tagger.encoder.layers[0].self_attn
    attn.rel_bias.normal_()  # a table as after training: every row different
    tagger(torch.randint(1, 16, (2, 12), generator=torch.Generator().manual_seed(seed)))  # sets the layer's mode
    after = attn.bias(torch.tensor([[5]]), torch.tensor([[6]]))[0, :, 0, 0]  # (nh,): key one after the query
    before = attn.bias(torch.tensor([[5]]), torch.tensor([[4]]))[0, :, 0, 0]  # key one before
    return {"bidirectional module vs reference, offsets −1000..1000": int((t5_bucket(offsets, True) != ref).sum()),
            "encoder bias, key after = table row 17": bool(torch.equal(after, attn.rel_bias[17])),
            "encoder bias, key before = table row 1": bool(torch.equal(before, attn.rel_bias[1])),
            "rows 17 and 1 differ": bool((attn.rel_bias[17] != attn.rel_bias[1]).all())}


# %% [markdown]
# ## 3. What one shared far scalar does to a longer input
#
# With one scalar for every far offset, the far keys of a longer input all get the same
# bias, and there are more of them. Ignore content (every q·k equal) and the softmax weight
# that position alone puts on keys at least D back is Σ_far e^b / Σ_all e^b. For T5 it
# tends to 1 as the input grows, in every head, whatever the table: n·e^b outgrows any
# fixed sum. For ALiBi it is at most Σ_{d≥D} e^(−m d) / Σ_{d≥0} e^(−m d) = e^(−m·D) per head,
# whatever the length: the steep heads stay local for good (m = 1/4: e^(−15/4) ≈ 0.02), the
# gentle ones (m = 1/256) do spread out.
# The T5 table here is the trained one of the extrapolation page's T5 arm (16 buckets, the
# last from distance 15), read at the query position 32·f − 1, f = 1, 2, 4, 16.

# %%
# --8<-- [start:far]
def positional_far_weight(attn: MultiHeadAttention, length: int, far_from: int) -> torch.Tensor:
    """(nh,) softmax weight that the bias alone puts on keys >= far_from back, for the last query of `length`."""
    q_pos, k_pos = torch.tensor([[length - 1]]), torch.arange(length)[None]
    attn.causal = True  # T5: causal buckets, as in the trained decoder
    b = attn.bias(q_pos, k_pos)[0, :, 0].detach()  # (nh, length)
    w = torch.softmax(b, dim=-1)
    return w[:, : length - far_from].sum(-1)


def far_weights(seed: int, factors=(1, 2, 4, 16), far_from: int = 15) -> dict[str, list[list[float]]]:
    t5 = trained("t5", seed).decoder.layers[0].self_attn
    alibi = ALiBiAttention(CFG.replace(positions="alibi"))
    return {name: [positional_far_weight(a, f * TRAIN_LEN, far_from).tolist() for f in factors]
            for name, a in (("T5 (trained, layer 0)", t5), ("ALiBi", alibi))}
# --8<-- [end:far]


# %% [markdown]
# ## 4. The fast path stays
#
# Neither scheme changes the score function, only adds a bias, so `uses_fast_path()` stays
# True and the fused kernel runs with the bias as its float `attn_mask` (−∞ where hidden).
# A spy on `F.scaled_dot_product_attention` counts the calls of a 2-layer decoder; the fused,
# explicit and tiled paths must agree, including the gradient of T5's learned table. Shaw's
# relative vectors change the score itself: no fast path (the contrast).

# %%
# --8<-- [start:fast]
def fast_path(seed: int) -> dict:
    out = {}
    calls = []
    real = F.scaled_dot_product_attention

    def spy(*args, **kwargs):
        calls.append(kwargs.get("attn_mask"))
        return real(*args, **kwargs)

    ids = torch.randint(1, 20, (2, 10), generator=torch.Generator().manual_seed(seed))
    for positions in ("alibi", "t5"):
        results = {}
        for impl in ("auto", "explicit", "tiled"):
            torch.manual_seed(seed)
            lm = DecoderLM(CFG.replace(positions=positions, vocab_size=20, attn_impl=impl, attn_block=4))
            if positions == "t5":
                with torch.no_grad():
                    for layer in lm.decoder.layers:
                        layer.self_attn.rel_bias.normal_()
            calls.clear()
            F.scaled_dot_product_attention = spy
            try:
                logits = lm(ids)
            finally:
                F.scaled_dot_product_attention = real
            logits.pow(2).mean().backward()
            grad = lm.decoder.layers[0].self_attn.rel_bias.grad if positions == "t5" else None
            fast = lm.decoder.layers[0].self_attn.uses_fast_path()
            results[impl] = (logits.detach(), grad, len(calls), calls[0] if calls else None, fast)
        ref, grad_ref, n_fused, mask, fast = results["auto"]
        out[positions] = {
            "uses_fast_path": fast,
            "SDPA calls (fused, explicit, tiled)": [results[i][2] for i in ("auto", "explicit", "tiled")],
            "float mask": mask is not None and mask.dtype.is_floating_point,
            "max |Δ logits| explicit, tiled vs fused": [(results[i][0] - ref).abs().max().item()
                                                         for i in ("explicit", "tiled")],
        }
        if grad_ref is not None:
            out[positions]["max |Δ grad of the table| explicit, tiled vs fused"] = [
                (results[i][1] - grad_ref).abs().max().item() for i in ("explicit", "tiled")]
    out["shaw uses_fast_path"] = ShawAttention(CFG.replace(positions="shaw")).uses_fast_path()
    return out
# --8<-- [end:fast]


# %%
if __name__ == "__main__":
    print(alibi_checks(0), {p: position_parameters(p) for p in ("alibi", "t5", "learned", "sinusoidal")})
    print(t5_checks(0))
    print(far_weights(0))
    print(fast_path(0))


# %% [markdown]
# ## Tests

# %%
import pytest  # noqa: E402


# --8<-- [start:test_alibi]
@pytest.mark.claim("C-ALIBI-1", "confirmed")
def test_alibi_adds_minus_slope_times_distance_and_nothing_else(ev, seed):
    """The module's bias is −m_h·|i − j| with Press et al.'s slopes (powers of two and not); ALiBi attention equals
    plain attention with the same weights plus that bias, and differs from it without; a decoder with ALiBi has
    no position parameter or table (a count of our module). Would be refuted by any other bias or slope, or by a
    position parameter."""
    r = alibi_checks(seed)
    slopes = {n: alibi_slopes(n).tolist() for n in (8, 16, 6, 12)}
    gaps = {n: max(abs(a - b) for a, b in zip(s, paper_slopes(n))) for n, s in slopes.items()}
    ev.record("slopes, 8 heads", slopes[8], expect="1/2, 1/4, ..., 1/256")
    ev.record("slopes, 6 heads (not a power of two)", slopes[6], expect="the 4-head slopes, then 2 of the 8-head ones")
    ev.record("max |module slope − paper slope|, 8, 16, 6, 12 heads", list(gaps.values()), expect="≈ 1e-8 (float32)")
    ev.record("max |module bias − (−m_h|i − j|)|", r["bias vs formula"], expect="≈ 1e-8 (float32 slopes)")
    ev.record("max |ALiBi attention − (plain attention + bias)|", r["alibi vs plain + bias"], expect="≈ 1e-8")
    ev.record("max |ALiBi attention − plain attention|, same weights", r["alibi vs plain"], expect="> 0")
    params = {p: position_parameters(p) for p in ("alibi", "t5", "learned", "sinusoidal")}
    ev.record("position parameters and stored tables beyond the no-position model (2 layers, max_len 512)", params,
              expect="ALiBi 0; T5 2 x 32 x 4; learned 512 x 32")
    assert max(gaps.values()) < 1e-6 and r["bias vs formula"] < 1e-6 and r["alibi vs plain + bias"] < 1e-6
    assert r["alibi vs plain"] > 1e-3 and r["extra state"] == [] and params["alibi"] == 0
    assert params["t5"] == 2 * 32 * 4 and params["learned"] == 512 * 32
# --8<-- [end:test_alibi]


# --8<-- [start:test_t5]
@pytest.mark.claim("C-T5-1", "confirmed")
def test_t5_bucket_map_parameters_and_far_offsets(ev, seed):
    """The bucket of every distance 0..1000 equals T5's rule written out in Python: 16 exact buckets, then log-spaced
    ones, the last shared by every distance from 113 on; a layer adds buckets × heads scalars; keys 200, 1000 and
    100 000 back get the same scalar, row 31 of the table. Exact, by construction. Would be refuted by a distance in
    the wrong bucket or far offsets with different biases. The encoder's bidirectional buckets are checked too: every
    offset −1000..1000 against T5's rule (keys after the query in the upper half), and a built encoder layer adds row 17
    for the key just after a query and row 1 for the key just before."""
    r = t5_checks(seed)
    for name, v in r.items():
        ev.record(name, v)
    assert r["module vs reference, distances 0..1000"] == 0 and r["exact buckets"] == list(range(16))
    assert r["first distance in the last bucket"] == 113 and r["buckets used"] == 32
    assert r["far scalars differ (max over heads)"] == 0.0 and r["far scalar equals table row 31"]
    assert r["parameters per layer"] == 32 * CFG.n_heads
    # the encoder's bidirectional buckets: both halves against T5's rule, and what a built encoder layer adds
    enc = t5_encoder_checks(seed)
    for name, v in enc.items():
        ev.record(name, v, key=False)
    assert enc["bidirectional module vs reference, offsets −1000..1000"] == 0
    assert enc["encoder bias, key after = table row 17"] and enc["encoder bias, key before = table row 1"]
    assert enc["rows 17 and 1 differ"]
# --8<-- [end:test_t5]


# --8<-- [start:test_far]
@pytest.mark.claim("C-T5-1", "confirmed")
def test_one_far_scalar_lets_far_keys_pile_up(ev, seed):
    """Content aside, the weight that T5's trained table puts on keys 15 or more back grows with the input length in
    every head (one scalar, more keys); ALiBi's stays under e^(−15 m_h) at every length, so its steepest head stays
    local. Measured on the extrapolation page's trained T5 arm; would be refuted if some T5 head's far weight stayed
    flat as the input grew."""
    w = far_weights(seed)
    for name, rows in w.items():
        ev.record(f"{name}: weight on keys >= 15 back at 1x, 2x, 4x, 16x (rows), per head", rows)
    t5 = torch.tensor(w["T5 (trained, layer 0)"])  # (4 lengths, nh)
    alibi = torch.tensor(w["ALiBi"])
    bound = torch.exp(-15 * alibi_slopes(CFG.n_heads))
    ev.record("T5: smallest growth over heads, 1x -> 16x", (t5[-1] - t5[0]).min().item(), expect="> 0 in every head")
    ev.record("ALiBi: largest excess over e^(−15 m_h), any head, any length", (alibi - bound).max().item(),
              expect="<= 0")
    ev.record("ALiBi steepest head (m = 1/4): weight at 1x and at 16x", [alibi[0, 0].item(), alibi[-1, 0].item()],
              expect="≈ e^(−3.75) ≈ 0.024 at both")
    assert (t5[1:] >= t5[:-1] - 1e-6).all() and (t5[-1] - t5[0]).min() > 0.1
    assert (alibi <= bound + 1e-6).all() and abs(alibi[-1, 0] - alibi[0, 0]) < 1e-3
# --8<-- [end:test_far]


# --8<-- [start:test_fast]
@pytest.mark.claim("C-ALIBI-1", "confirmed")
@pytest.mark.claim("C-T5-1", "confirmed")
def test_a_bias_keeps_the_fast_path(ev, seed):
    """With ALiBi or T5, uses_fast_path() is True; the fused kernel is called once per layer with a float mask, and
    the explicit and tiled paths give the same logits and (T5) the same gradient of the table. Shaw, which changes
    the score, has no fast path. Exact up to float32 rounding."""
    r = fast_path(seed)
    for p in ("alibi", "t5"):
        for name, v in r[p].items():
            ev.record(f"{p}: {name}", v)
    ev.record("Shaw: uses_fast_path()", r["shaw uses_fast_path"], expect="False: it replaces the score")
    for p in ("alibi", "t5"):
        assert r[p]["uses_fast_path"] and r[p]["float mask"]
        assert r[p]["SDPA calls (fused, explicit, tiled)"] == [CFG.n_layers, 0, 0]
        assert max(r[p]["max |Δ logits| explicit, tiled vs fused"]) < 1e-5
    assert max(r["t5"]["max |Δ grad of the table| explicit, tiled vs fused"]) < 1e-4
    assert r["shaw uses_fast_path"] is False
# --8<-- [end:test_fast]
