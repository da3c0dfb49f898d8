# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% [markdown]
# # Why divide by √d_k?
#
# Proofs for the page `docs/attention/why-scale-sqrt-dk.md`. Every function below
# builds on the shared module (`proofs/transformer/`) and flips one switch:
# `attn_scale` ("sqrt_dk" or "none") or `qk_norm` ("none" or "layer").
# Run it with `pytest proofs/attention/proof_scale_sqrt_dk.py`, or open it as a
# notebook with `jupytext --to notebook proofs/attention/proof_scale_sqrt_dk.py`.

# %%
from __future__ import annotations

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from proofs.tasks import reverse_task
from proofs.train import accuracy, fixed_batches, train
from proofs.transformer import EncoderTagger, MultiHeadAttention, TransformerConfig, record_attention

D_KS = [4, 16, 64, 256, 1024]  # head sizes swept by the measurements


# %% [markdown]
# ## 1. One attention head whose q and k have unit-variance components
#
# One head (`n_heads=1`, so d_k = d_model) with orthogonal W_Q and W_K and no
# bias: for x ~ N(0, I) the queries and keys then have exactly the i.i.d. N(0, 1)
# components the paper's footnote 4 assumes. Queries and keys come from
# independent inputs, so every q·k is a sum of d_k independent products.

# %%
# --8<-- [start:head]
def unit_head(d_k: int, **switches) -> MultiHeadAttention:
    cfg = TransformerConfig(d_model=d_k, n_heads=1, bias=False, dropout_attn=0.0, **switches)
    attn = MultiHeadAttention(cfg)
    for w in (attn.w_q, attn.w_k, attn.w_v, attn.w_o):
        nn.init.orthogonal_(w.weight)
    return attn.eval()


def head_statistics(d_k: int, seed: int, n_queries: int = 64, n_keys: int = 16, batch: int = 32, **switches) -> dict:
    """Score variance, softmax peak, softmax Jacobian norm and gradient norm for one head."""
    torch.manual_seed(seed)
    attn = unit_head(d_k, **switches)
    x = torch.randn(batch, n_queries, d_k, requires_grad=True)  # queries' inputs
    kv = torch.randn(batch, n_keys, d_k)  # keys' and values' inputs
    with record_attention(attn):
        y = attn(x, kv)
        q, k, _ = attn.project(x, kv)
        scores = attn.score(q, k)  # the logits softmax sees, after the switch's scale
        p = attn.weights  # (B, 1, Tq, Tk)
    # softmax Jacobian per row: J = diag(p) - p p^T; its Frobenius norm says how much the weights can move
    jac = torch.diag_embed(p) - p[..., :, None] * p[..., None, :]
    jac_norm = jac.flatten(-2).norm(dim=-1).mean()
    (y * torch.randn_like(y)).sum().backward()  # a random linear loss on the output
    row_grad = x.grad.norm(dim=-1).flatten()  # gradient reaching each query's input
    return {
        "score_var": scores.var().item(),
        "raw_var": (q @ k.transpose(-2, -1)).var().item(),  # q.k before any scale
        "max_weight": p.max(-1).values.mean().item(),
        "jacobian_norm": jac_norm.item(),
        "grad_median": row_grad.median().item(),  # the typical query
        "grad_q90": row_grad.quantile(0.9).item(),  # the largest tenth
    }
# --8<-- [end:head]


# %% [markdown]
# ## 2. A training run where the scale is the only difference
#
# A 2-layer encoder with one head (d_k = d_model = 64, the paper's head size)
# learns to reverse a sequence, which needs attention to a position-dependent key.
# Same seeds, same batches; only `attn_scale` (and, for QK-norm, `qk_norm`) changes.

# %%
# --8<-- [start:train]
def reverse_accuracy(seed: int, steps: int = 200, d_model: int = 64, **switches) -> float:
    torch.manual_seed(seed)
    cfg = TransformerConfig(vocab_size=16, d_model=d_model, n_heads=1, d_ff=2 * d_model, n_layers=2,
                            dropout_emb=0.0, dropout_residual=0.0, **switches)
    model = EncoderTagger(cfg)
    train(model, fixed_batches(reverse_task, 1000 + seed, batch=32, length=10, vocab=16), steps, lr=2e-3)
    x, y = reverse_task(torch.Generator().manual_seed(10_000 + seed), 512, 10, 16)
    return accuracy(model, x, y)
# --8<-- [end:train]


def layer_query_variance(seed: int, layer: int, **switches) -> float:
    """Variance of the query components at initialisation inside encoder layer `layer` of the full model."""
    torch.manual_seed(seed)
    cfg = TransformerConfig(vocab_size=64, d_model=64, n_heads=4, n_layers=2, dropout_emb=0.0,
                            dropout_residual=0.0, **switches)
    model = EncoderTagger(cfg).eval()
    seen = {}
    attn = model.encoder.layers[layer].self_attn

    def keep_input(module, inputs, output):  # returns None: the forward is left unchanged
        seen["x"] = inputs[0]

    hook = attn.register_forward_hook(keep_input)
    ids = torch.randint(0, 64, (32, 16))
    with torch.no_grad():
        model(ids)
        q, _, _ = attn.project(seen["x"], seen["x"])
    hook.remove()
    return q.var().item()


# %%
if __name__ == "__main__":  # notebook / script: flip a switch above and rerun
    for d in D_KS:
        print(d, head_statistics(d, seed=0), head_statistics(d, seed=0, attn_scale="none"))
    print("scaled", reverse_accuracy(0), "unscaled", reverse_accuracy(0, attn_scale="none"))


# %% [markdown]
# ## Tests: each asserts the difference the switch makes

# %%
import pytest  # noqa: E402


def _plot_saturation(ev, rows):
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(11, 3.2))
    for arm, style in (("sqrt_dk", "o-"), ("none", "s--")):
        r = [row[arm] for row in rows]
        axes[0].loglog(D_KS, [x["score_var"] for x in r], style, label=f"attn_scale={arm}")
        axes[1].semilogx(D_KS, [x["max_weight"] for x in r], style, label=arm)
        axes[2].loglog(D_KS, [x["jacobian_norm"] for x in r], style, label=arm)
    axes[0].set(title="Var of the logits", xlabel="d_k")
    axes[1].set(title="mean largest softmax weight", xlabel="d_k", ylim=(0, 1.05))
    axes[2].set(title="softmax Jacobian norm", xlabel="d_k")
    axes[0].legend()
    fig.tight_layout()
    ev.figure(fig, "saturation", "Logit variance, softmax peak and softmax Jacobian norm against d_k, "
                                 "one head with unit-variance q and k (16 keys).")


@pytest.mark.claim("C-SCALE-1", "confirmed")
def test_dot_product_variance_is_d_k(ev, seed):
    """Var(q·k) = d_k for unit-variance components; dividing by √d_k brings it back to 1."""
    for d in D_KS:
        raw = head_statistics(d, seed)["raw_var"]
        scaled = head_statistics(d, seed)["score_var"]
        ev.record(f"Var(q·k) at d_k={d}", raw, expect=f"≈ {d}", key=d in (4, 1024))
        ev.record(f"Var(q·k/√d_k) at d_k={d}", scaled, expect="≈ 1", key=d == 1024)
        assert raw / d == pytest.approx(1.0, abs=0.1)
        assert scaled == pytest.approx(1.0, abs=0.1)


# --8<-- [start:test_saturation]
@pytest.mark.claim("C-SCALE-2", "confirmed")
@pytest.mark.claim("C-FOLK-5", "nuanced")
def test_unscaled_softmax_saturates_and_gradients_vanish(ev, seed):
    """Without the scale the softmax turns one-hot as d_k grows and its Jacobian (and the gradient) collapse."""
    rows = [{arm: head_statistics(d, seed, attn_scale=arm) for arm in ("sqrt_dk", "none")} for d in D_KS]
    _plot_saturation(ev, rows)
    for d, row in zip(D_KS, rows):
        key = d in (16, 1024)
        ev.record(f"max weight, unscaled, d_k={d}", row["none"]["max_weight"], expect="→ 1 as d_k grows", key=key)
        ev.record(f"max weight, scaled, d_k={d}", row["sqrt_dk"]["max_weight"], expect="flat in d_k", key=key)
        ev.record(f"Jacobian norm ratio unscaled/scaled, d_k={d}",
                  row["none"]["jacobian_norm"] / row["sqrt_dk"]["jacobian_norm"], expect="falls with d_k", key=key)
        if d in (64, 1024):
            for stat, what in (("grad_median", "median"), ("grad_q90", "90th percentile")):
                ev.record(f"{what} per-query gradient, unscaled/scaled, d_k={d}",
                          row["none"][stat] / row["sqrt_dk"][stat], key=d == 1024)
    big, small = rows[-1], rows[1]
    assert big["none"]["max_weight"] > 0.9  # saturated: nearly one-hot rows
    assert big["sqrt_dk"]["max_weight"] < 0.5  # scaled: weights stay spread, whatever d_k
    assert abs(big["sqrt_dk"]["max_weight"] - small["sqrt_dk"]["max_weight"]) < 0.05
    assert big["none"]["jacobian_norm"] < 0.2 * big["sqrt_dk"]["jacobian_norm"]
    # C-FOLK-5: the typical query's gradient vanishes; only a minority of unsaturated rows get larger ones
    assert big["none"]["grad_median"] < 0.05 * big["sqrt_dk"]["grad_median"]
    assert big["none"]["grad_q90"] > 2 * big["sqrt_dk"]["grad_q90"]

    seeds = [seed, seed + 1, seed + 2]
    scaled = [reverse_accuracy(s) for s in seeds]
    unscaled = [reverse_accuracy(s, attn_scale="none") for s in seeds]
    ev.record("reverse accuracy, scaled (3 seeds)", scaled, expect="learns")
    ev.record("reverse accuracy, unscaled (3 seeds)", unscaled, expect="stalls near chance (1/15)")
    assert min(scaled) - max(unscaled) > 0.5
# --8<-- [end:test_saturation]


@pytest.mark.claim("C-SCALE-3", "refuted")
def test_unit_variance_does_not_come_from_embedding_scale(ev, seed):
    """The √d_model embedding factor changes the queries of layer 1 only; later layers see LayerNorm output."""
    v = {(layer, on): layer_query_variance(seed, layer, scale_embeddings=on) for layer in (0, 1) for on in (True, False)}
    r1, r2 = v[0, True] / v[0, False], v[1, True] / v[1, False]
    ev.record("Var(q) in layer 1, ×√d_model on / off", r1, expect="≈ 3 = (1 + ½)/(1/d + ½): the factor reaches layer 1")
    ev.record("Var(q) in layer 2, ×√d_model on / off", r2, expect="≈ 1: LayerNorm output, whatever the embedding")
    assert r1 > 2.0 and 0.8 < r2 < 1.25
    # What does set the variance: the projection weights' scale. Shrink W_Q, W_K by 10: logits variance / 10^4.
    torch.manual_seed(seed)
    attn = unit_head(64)
    x = torch.randn(8, 16, 64)
    with torch.no_grad():
        q, k, _ = attn.project(x, x)
        before = attn.score(q, k).var().item()
        attn.w_q.weight.mul_(0.1)
        attn.w_k.weight.mul_(0.1)
        q, k, _ = attn.project(x, x)
        after = attn.score(q, k).var().item()
    ev.record("logit variance ratio when W_Q, W_K shrink ×0.1", after / before, expect="1e-4: the weights set it")
    assert after / before == pytest.approx(1e-4, rel=0.05)


# --8<-- [start:test_qknorm]
@pytest.mark.claim("C-SCALE-4", "nuanced")
def test_qk_layernorm_needs_a_temperature(ev, seed):
    """LayerNorm on q and k bounds their norm but leaves Var(q·k) ≈ d_k: it works with the scale, not instead of it."""
    d = 256
    ln_only = head_statistics(d, seed, attn_scale="none", qk_norm="layer")
    ln_scaled = head_statistics(d, seed, attn_scale="sqrt_dk", qk_norm="layer")
    ev.record("Var(logits), qk-LayerNorm without scale, d_k=256", ln_only["score_var"], expect="≈ 256 (still d_k)")
    ev.record("max weight, qk-LayerNorm without scale", ln_only["max_weight"], expect="saturated, like unscaled")
    ev.record("max weight, qk-LayerNorm with 1/√d_k", ln_scaled["max_weight"], expect="spread")
    assert ln_only["score_var"] / d == pytest.approx(1.0, abs=0.15)
    assert ln_only["max_weight"] > 0.9 > 0.5 > ln_scaled["max_weight"]

    seeds = [seed, seed + 1, seed + 2]
    with_scale = [reverse_accuracy(s, qk_norm="layer") for s in seeds]
    without = [reverse_accuracy(s, qk_norm="layer", attn_scale="none") for s in seeds]
    ev.record("reverse accuracy, qk-LayerNorm + 1/√d_k (3 seeds)", with_scale, expect="learns")
    ev.record("reverse accuracy, qk-LayerNorm, no scale (3 seeds)", without, expect="stalls")
    assert min(with_scale) - max(without) > 0.5
    # The extra compute: two LayerNorms over (T, d_k) per head, against 2·T²·d_k multiply-adds of QKᵀ alone.
    T = 16
    ev.record("extra elementwise work of qk-LayerNorm vs QKᵀ FLOPs, T=16, d_k=64", (2 * 5 * T * 64) / (2 * T * T * 64),
              expect="small, shrinking as 1/T")
# --8<-- [end:test_qknorm]


@pytest.mark.claim("C-SCALE-5", "refuted")
def test_scale_adds_no_speed(ev, seed):
    """The scale changes no matrix product: attention does the same FLOPs with or without it, plus one multiply per score."""
    counts = {}
    for arm in ("sqrt_dk", "none"):
        attn = unit_head(64, attn_scale=arm, attn_impl="explicit")
        x = torch.randn(4, 32, 64)
        with FlopCounterMode(display=False) as fc, torch.no_grad():
            attn(x)
        counts[arm] = fc.get_total_flops()
    ev.record("matmul FLOPs with 1/√d_k", counts["sqrt_dk"])
    ev.record("matmul FLOPs without", counts["none"])
    ev.record("extra elementwise multiplies from the scale (B·h·T²)", 4 * 1 * 32 * 32, expect="≈ 1/(2·d_k) of QKᵀ")
    assert counts["sqrt_dk"] == counts["none"] > 0
