# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% [markdown]
# # What if self-attention skips the Q/K/V projections?
#
# Proofs for `docs/attention/no-projections.md`. One switch of the shared model:
# `qkv_proj` (True: learned W_Q, W_K, W_V as in the paper; False: each head's
# q = k = v = its slice of the input, W_O kept). Then s_ij = x_i · x_j / √d_k.
# Run: `pytest proofs/attention/proof_no_projections.py`.

# %%
from __future__ import annotations

from functools import cache

import torch
from torch import nn

from proofs.tasks import previous_token_task
from proofs.train import accuracy, fixed_batches, train
from proofs.transformer import EncoderTagger, MultiHeadAttention, TransformerConfig, record_attention

D, T = 64, 16  # one head of d_k = 64 (the paper's head size), 16 tokens per row
SIGMAS = [D**-0.5, 0.25, 0.5, 1.0, 2.0]  # standard deviation of the entries of x


# %% [markdown]
# ## 1. Scores without projections: the diagonal and Cauchy–Schwarz
#
# s_ii = ‖x_i‖² and s_ij = x_i·x_j ≤ ‖x_i‖‖x_j‖. If every token has the same norm the
# diagonal is the largest score of its row (ties only with an identical token). If norms
# differ, a longer token pointing roughly the same way wins.

# %%
# --8<-- [start:scores]
def bare_head(d: int = D, n_heads: int = 1, **switches) -> MultiHeadAttention:
    """The shared attention with qkv_proj=False: q = k = v = x, split into heads."""
    return MultiHeadAttention(TransformerConfig(d_model=d, n_heads=n_heads, qkv_proj=False, **switches)).eval()


def self_is_top(seed: int, equal_norms: bool, batch: int = 256) -> dict:
    """How often a token's own score is the largest in its row, and the smallest margin s_ii − max_{j≠i} s_ij."""
    torch.manual_seed(seed)
    attn = bare_head()
    x = torch.randn(batch, T, D)
    if equal_norms:
        x = x / x.norm(dim=-1, keepdim=True) * D**0.5  # every token has norm √d
    else:
        x = x * torch.rand(batch, T, 1) * 2  # norms spread over (0, 2√d)
    with torch.no_grad():
        q, k, _ = attn.project(x, x)
        s = attn.score(q, k)[:, 0]  # (B, T, T)
    eye = torch.eye(T, dtype=torch.bool)
    margin = s.diagonal(dim1=-2, dim2=-1) - s.masked_fill(eye, float("-inf")).max(-1).values
    return {"top_fraction": (s.argmax(-1) == torch.arange(T)).float().mean().item(), "min_margin": margin.min().item()}
# --8<-- [end:scores]


# %% [markdown]
# ## 2. How much weight stays on the diagonal depends on the scale of x
#
# With entries N(0, σ²): s_ii ≈ σ²d/√d_k and s_ij ~ N(0, σ⁴d)/√d_k. At σ = 1 the diagonal
# leads by about √d_k = 8 units and takes nearly all the weight; at σ = 1/√d (tensor2tensor's
# N(0, 1/d_model) embedding initialisation before the ×√d_model; the paper states none) every
# score is near 0 and the row is near uniform.

# %%
# --8<-- [start:diagonal]
def diagonal_mass(sigma: float, seed: int, batch: int = 64, **switches) -> float:
    """Mean softmax weight a token puts on itself when q = k = v = x, x with N(0, σ²) entries."""
    torch.manual_seed(seed)
    attn = bare_head(**switches)
    x = torch.randn(batch, T, D) * sigma
    with torch.no_grad(), record_attention(attn):
        attn(x)
    return attn.weights.diagonal(dim1=-2, dim2=-1).mean().item()
# --8<-- [end:diagonal]


# %% [markdown]
# ## 3. Can a model without projections still learn to use context?
#
# The previous-token task (output the token at t−1) needs attention away from the diagonal.
# One encoder layer with one head of d_k = d_model = 32 (so the projections change no
# dimension, only the comparison), sinusoidal positions, 120 Adam steps at learning rate 6e-3,
# batch 32, length 12; the same seed and batches with and without W_Q, W_K, W_V. A third arm
# stacks two layers without projections: the second layer's input has passed through the first
# layer's W_O, FFN and LayerNorm. A fourth arm is one projection-free layer whose diagonal is hidden
# (each query may not attend to itself, as Reformer does for shared-QK attention): it removes the
# diagonal's lead and leaves the other obstacle, the symmetric score, to be seen on its own. Each arm
# is trained once per seed (cached).

# %%
# --8<-- [start:learn]
class HideSelf(nn.Module):
    """The layer's own attention, called with its diagonal hidden: query i may not attend to key i."""

    def __init__(self, attn: nn.Module):
        super().__init__()
        self.attn = attn

    def forward(self, h, **kwargs):
        return self.attn(h, attn_mask=torch.eye(h.shape[1], dtype=torch.bool, device=h.device), **kwargs)


@cache
def previous_token(qkv_proj: bool, seed: int, n_layers: int = 1, steps: int = 120, d_model: int = 32,
                   vocab: int = 16, length: int = 12, hide_self: bool = False) -> dict:
    torch.manual_seed(seed)
    cfg = TransformerConfig(vocab_size=vocab, d_model=d_model, n_heads=1, d_ff=2 * d_model, n_layers=n_layers,
                            qkv_proj=qkv_proj, dropout_emb=0.0, dropout_residual=0.0)
    model = EncoderTagger(cfg)
    if hide_self:
        for layer in model.encoder.layers:
            layer.self_attn = HideSelf(layer.self_attn)
    x, y = previous_token_task(torch.Generator().manual_seed(10_000 + seed), 512, length, vocab)

    def weights() -> list[torch.Tensor]:  # (B, T, T) attention weights of head 0, per layer
        with torch.no_grad(), record_attention(model) as mods:
            model(x)
        return [m.weights[:, 0] for m in mods]

    def self_weight() -> list[float]:  # mean weight on the token itself, per layer
        return [w.diagonal(dim1=-2, dim2=-1).mean().item() for w in weights()]

    at_init = self_weight()
    train(model, fixed_batches(previous_token_task, 100 + seed, batch=32, length=length, vocab=vocab), steps, lr=6e-3)
    t = torch.arange(1, length - 1)  # positions with both neighbours
    w = weights()[0]
    same = (x[:, :, None] == x[:, None, :]) & ~torch.eye(length, dtype=torch.bool)  # another key holding the query's symbol
    other = x[:, :, None] != x[:, None, :]
    return {"acc": accuracy(model, x, y), "self_init": at_init, "self_trained": self_weight(),
            "left": w[:, t, t - 1].mean().item(), "right": w[:, t, t + 1].mean().item(),  # layer 1: t−1, t+1
            "repeat": w[same].mean().item(), "other": w[other].mean().item()}  # layer 1: weight per key
# --8<-- [end:learn]


# %%
if __name__ == "__main__":
    print(self_is_top(0, True), self_is_top(0, False))
    for s in SIGMAS:
        print(s, diagonal_mass(s, 0), diagonal_mass(s, 0, attn_scale="none"))
    print(previous_token(True, 0), previous_token(False, 0), previous_token(False, 0, n_layers=2))


# %% [markdown]
# ## Tests

# %%
import pytest  # noqa: E402


@pytest.mark.claim("C-NOPROJ-1", "nuanced")
def test_self_scores_highest_only_when_norms_are_equal(ev, seed):
    """Equal norms: the token's own score tops every row (exact, Cauchy–Schwarz). Norms spread over (0, 2√d): often
    not. Would be confirmed as stated ("every token scores itself highest") if the unequal-norm rows were all
    topped by the token itself too."""
    equal, mixed = self_is_top(seed, True), self_is_top(seed, False)
    ev.record("rows whose top score is the token itself, equal norms", equal["top_fraction"], expect="1 (exact)")
    ev.record("smallest s_ii − max_j s_ij, equal norms", equal["min_margin"], expect="≥ 0")
    ev.record("rows whose top score is the token itself, norms spread over (0, 2√d)", mixed["top_fraction"],
              expect="< 1")
    assert equal["top_fraction"] == 1.0 and equal["min_margin"] > 0
    assert mixed["top_fraction"] < THRESHOLDS["mixed norms top"]


def _plot(ev, rows):
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 3.3))
    for arm, style in (("sqrt_dk", "o-"), ("none", "s--")):
        ax.semilogx(SIGMAS, [r[arm] for r in rows], style, label=f"attn_scale={arm}")
    ax.axhline(1 / T, color="grey", lw=0.8, ls=":")
    ax.text(1.0, 1 / T + 0.02, "uniform: 1/T", color="grey", fontsize=8)
    ax.set(xlabel="std σ of the entries of x", ylabel="mean weight on itself", ylim=(0, 1.05),
           title=f"q = k = v = x, d_k = {D}, T = {T}")
    ax.set_xticks(SIGMAS, ["1/√d", "0.25", "0.5", "1", "2"])
    ax.minorticks_off()
    ax.legend()
    fig.tight_layout()
    ev.figure(fig, "diagonal", "Mean attention weight a token puts on itself without projections, against the "
                               "scale of x, with and without the 1/√d_k scale.")


# --8<-- [start:test_identity]
@pytest.mark.claim("C-FOLK-3", "nuanced")
def test_identity_or_average_depends_on_the_scale_of_x(ev, seed):
    """Without projections attention is close to the identity for unit-variance x and close to a uniform
    average for x of the embedding initialisation's scale; the 1/√d_k scale moves the crossover. Would be
    confirmed as stated ("attention is the identity") if small inputs kept most of their weight on themselves."""
    rows = [{arm: diagonal_mass(s, seed, attn_scale=arm) for arm in ("sqrt_dk", "none")} for s in SIGMAS]
    _plot(ev, rows)
    for s, r in zip(SIGMAS, rows):
        ev.record(f"weight on itself, σ={s:.3g}, scaled", r["sqrt_dk"], key=s in (SIGMAS[0], 1.0))
        ev.record(f"weight on itself, σ={s:.3g}, unscaled", r["none"], key=s == 0.5)
    small, unit = rows[0], rows[SIGMAS.index(1.0)]
    half = rows[SIGMAS.index(0.5)]
    # over seeds 100-139 (sd below 0.003 for every value): σ=1 scaled 0.983, σ=1/√d scaled 0.070, σ=0.5 unscaled
    # 0.9999 and scaled 0.329; every threshold is more than 20 sd away
    assert unit["sqrt_dk"] > 0.9  # near the identity ...
    assert small["sqrt_dk"] < 2 / T  # ... or near a uniform average (1/T), same code, different scale
    assert half["none"] > 0.9 and half["sqrt_dk"] < 0.5  # the scale decides where the switch happens
# --8<-- [end:test_identity]


# --8<-- [start:test_learn]
@pytest.mark.claim("C-NOPROJ-1", "nuanced")
@pytest.mark.claim("C-FOLK-3", "nuanced")
def test_one_layer_without_projections_cannot_leave_the_diagonal(ev, seed):
    """One layer without W_Q, W_K, W_V keeps most weight on the token itself and stays at the no-context floor on
    'previous token'; with them it learns the task. A second projection-free layer, whose input the first layer
    has transformed, gets above the floor. Would be refuted if the one-layer model without projections learned
    the task, and "cannot use context at all" confirmed if the two-layer one stayed at the floor too. With the diagonal
    hidden, the one-layer model without projections still cannot prefer t−1 to t+1 (its scores are symmetric and the
    sinusoids' part depends on |i − j| only); it would show the diagonal to be the only obstacle if it then learned
    the task."""
    proj, bare, deep = previous_token(True, seed), previous_token(False, seed), previous_token(False, seed, n_layers=2)
    hid = previous_token(False, seed, hide_self=True)
    # two effects are averaged over two seeds (seed, seed + 1): the second layer's gain, small in this budget, and the
    # gain from the projections, whose lower tail is long (on a few seeds the model with projections learns slowly)
    gain = [previous_token(False, s, n_layers=2)["acc"] - previous_token(False, s)["acc"] for s in (seed, seed + 1)]
    helps = [previous_token(True, s)["acc"] - previous_token(False, s)["acc"] for s in (seed, seed + 1)]
    ev.record("accuracy with W_Q, W_K, W_V, 1 layer", proj["acc"], expect="≈ 1")
    ev.record("accuracy without, 1 layer", bare["acc"],
              expect="≈ 1/12 + 11/12 · 1/15: only position 0, whose target is itself")
    ev.record("accuracy without, 2 layers", deep["acc"], expect="above 1 layer (asserted on the mean of 2 seeds)")
    ev.record("weight on itself at init, with projections", proj["self_init"][0], expect="≈ 1/12: uniform")
    ev.record("weight on itself at init, without", bare["self_init"][0], expect="most of the row")
    ev.record("weight on itself after training, without, 1 layer", bare["self_trained"][0],
              expect="still most of the row")
    ev.record("weight on itself after training, without, 2 layers: layer 1", deep["self_trained"][0],
              expect="stays, as in the 1-layer model")
    ev.record("weight on itself after training, without, 2 layers: layer 2", deep["self_trained"][1],
              expect="lower: layer 2 compares transformed tokens")
    ev.record("accuracy gap, with − without projections, 1 layer", proj["acc"] - bare["acc"], key=False)
    ev.record("accuracy gap, with − without projections, 1 layer (mean of 2 seeds)", sum(helps) / 2, key=False)
    ev.record("accuracy gap, without: 2 layers − 1 layer (mean of 2 seeds)", sum(gain) / 2, key=False)
    ev.record("self weight, without, 2 layers: layer 1 − layer 2", deep["self_trained"][0] - deep["self_trained"][1],
              key=False)
    ev.record("accuracy without, 1 layer, diagonal hidden", hid["acc"],
              expect="still far below: below ½(1 + 1/15), what knowing both neighbours but not their order gives")
    ev.record("weight on t−1, t+1 after training, without, diagonal hidden", [round(hid["left"], 3), round(hid["right"], 3)],
              expect="equal: a symmetric score cannot tell left from right")
    ev.record("weight on t−1, t+1 after training, with projections", [round(proj["left"], 3), round(proj["right"], 3)],
              expect="t−1 chosen")
    ev.record("|weight on t−1 − weight on t+1|, without, diagonal hidden", abs(hid["left"] - hid["right"]), key=False)
    ev.record("weight per key after training, without, 1 layer: same symbol as the query, other symbol",
              [round(bare["repeat"], 3), round(bare["other"], 3)], expect="a repeat of the token takes far more")
    ev.record("weight per key, same symbol / other symbol, without, 1 layer", bare["repeat"] / bare["other"], key=False)
    # thresholds: THRESHOLDS, from the spread over seeds 100-139 (comment there)
    assert sum(helps) / 2 > THRESHOLDS["projections help"]
    assert bare["acc"] < THRESHOLDS["floor"]
    assert bare["self_trained"][0] > THRESHOLDS["diagonal"] > proj["self_init"][0]
    assert sum(gain) / 2 > THRESHOLDS["second layer helps"]
    assert deep["self_trained"][0] - deep["self_trained"][1] > THRESHOLDS["second layer lets go"]
    assert hid["acc"] < THRESHOLDS["diagonal hidden"]  # removing the diagonal's lead is not enough ...
    assert abs(hid["left"] - hid["right"]) < THRESHOLDS["left = right"]  # ... the score cannot tell t−1 from t+1
    assert bare["repeat"] > THRESHOLDS["repeat / other"] * bare["other"]  # a repeat of the token scores almost as itself
# --8<-- [end:test_learn]


# --8<-- [start:thresholds]
# Thresholds, from seeds 100-139 (one seed per value unless said), each with its reason. Mixed norms: the own key
# tops 0.864 ± 0.005 of the rows (max 0.879): threshold 0.95, 16 sd away. With − without projections, 1 layer:
# 0.78 ± 0.12 per seed (min 0.26, a seed on which the model with projections learns slowly: one seed alone would
# leave the threshold inside the tail), so the test asserts the mean of two seeds: 0.777 ± 0.080 (min 0.49),
# threshold 0.2, 7 sd below the mean and 0.29 below the lowest. Without
# projections, 1 layer: 0.154 ± 0.011 (max 0.18), and a sweep of 20 random seeds (rng 2027) reached 0.211, a longer
# tail than the sd says: floor threshold 0.3, still a third of the 0.95 with projections. Weight on itself after
# training without projections 0.64 ± 0.05 (min 0.54; 0.44 in the 20-seed sweep) and at init with them 0.08 ± 0.02
# (max 0.15): diagonal threshold 0.3, between the two tails. 2 layers − 1 layer without projections 0.118 ± 0.032
# per seed, about ± 0.023 for the mean of two seeds: threshold 0.02. Self weight layer 1 − layer 2 0.46 ± 0.04:
# threshold 0.2. Diagonal hidden, no projections, 1 layer: accuracy 0.263 ± 0.012 (min 0.236, max 0.285; seed 0
# 0.263): threshold 0.4, 11 sd above and below ½(1 + 1/15) ≈ 0.53; weight on t−1 0.135 ± 0.003, on t+1
# 0.130 ± 0.003, |difference| 0.005 ± 0.003 (max 0.013): threshold 0.05. Weight per key in the trained one-layer
# model without projections, a key with the query's own symbol over a key with another symbol: 19.2 ± 8.0, skewed
# (from 7.9 to 39): threshold 2, four times below the lowest seed (a ratio near 1 would mean repeats get no extra
# weight and the follow-up's explanation fails).
THRESHOLDS = {"mixed norms top": 0.95, "projections help": 0.2, "floor": 0.3, "diagonal": 0.3,
              "second layer helps": 0.02, "second layer lets go": 0.2, "diagonal hidden": 0.4, "left = right": 0.05,
              "repeat / other": 2}
# --8<-- [end:thresholds]
