# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% [markdown]
# # Why dot-product attention and not additive?
#
# Proofs for the page `docs/attention/dot-vs-additive.md`. One switch of the shared
# module (`proofs/transformer/`) is flipped: `score_fn` ("dot": q·k, or "additive":
# Bahdanau's v·tanh(q + k) per head, the class `AdditiveAttention`), and for the
# dot product `attn_scale` ("sqrt_dk" or "none").
# Run it with `pytest proofs/attention/proof_dot_vs_additive.py`, or open it as a
# notebook with `jupytext --to notebook proofs/attention/proof_dot_vs_additive.py`.

# %%
from __future__ import annotations

import math
import time
from functools import cache, lru_cache

import torch
from torch.utils.flop_counter import FlopCounterMode

from proofs.measure import LargestTensor
from proofs.tasks import reverse_task
from proofs.train import accuracy, fixed_batches, train
from proofs.transformer import EncoderTagger, TransformerConfig, make_self_attention, record_attention

LENGTHS = [16, 32, 64, 128, 256]  # sequence lengths n of the cost sweep (d_k = 64 fixed)
TIMED = [64, 256]  # lengths at which both heads are timed side by side
D_KS = [16, 64, 256, 1024]  # head sizes of the logit measurements
ARMS = {  # the three attention scores compared; the rest of the model is the same
    "additive": {"score_fn": "additive"},
    "dot, scaled": {},  # q·k/√d_k, the paper's default
    "dot, unscaled": {"attn_scale": "none"},  # q·k, what §3.2.1 compares additive attention with
}


# %% [markdown]
# ## 1. What each score costs: counted, then timed
#
# One head of size d_k = 64 over n tokens (batch 1), both on the explicit path (the
# softmax weights are materialised in both). `FlopCounterMode` counts the FLOPs of
# matrix products only; the elementwise work of the additive score (q_i + k_j and a
# tanh, for every pair and every channel) it does not see, so that part is a formula
# from the shapes. A dispatch mode records the largest tensor any operator creates.
# Then the two heads are timed side by side in this process, alternating, and the
# ratio of their best times is what the test asserts: a ratio, not seconds, because
# seconds depend on the machine and on what else runs on it.

# %%
# --8<-- [start:cost]
def head(score_fn: str, d_k: int = 64):
    """One head of size d_k on the explicit path, dot product or additive score."""
    return make_self_attention(TransformerConfig(d_model=d_k, n_heads=1, score_fn=score_fn, attn_impl="explicit"))


def attention_cost(n: int, score_fn: str, d_k: int = 64) -> dict:
    """Counted matmul FLOPs, elementwise score ops (a formula from shapes) and the largest tensor, over n tokens."""
    attn = head(score_fn, d_k).eval()
    x = torch.randn(1, n, d_k)
    largest = LargestTensor()
    with torch.no_grad(), FlopCounterMode(display=False) as flops, largest:
        attn(x)
    pairs = n * n  # (i, j) pairs of the one head
    # formula: additive forms q_i + k_j and a tanh on every channel of every pair; dot: one 1/√d_k multiply per pair
    elementwise = 2 * pairs * d_k if score_fn == "additive" else pairs
    return {"matmul_flops": flops.get_total_flops(), "elementwise": elementwise, "largest": largest.largest}


def best_times(n: int, d_k: int = 64, reps: int = 12, backward: bool = False, calls: int = 4) -> dict[str, float]:
    """Best-of-reps CPU seconds of one call of each head (each timing covers `calls` calls), timed alternately (dot, additive, dot, ...), on one torch
    thread and this thread's own CPU clock.

    On one thread all the work runs on the calling thread, so `time.thread_time` counts the work itself: time the
    thread spends descheduled while other programs hold the cores is not counted, and no parallel region waits for
    a busy core (with several threads, a loaded machine can stretch a 50-microsecond call to a scheduler tick).
    The minimum over repetitions and the alternation remove what noise remains (cache state, frequency)."""
    heads = {fn: head(fn, d_k) for fn in ("dot", "additive")}
    x = torch.randn(1, n, d_k)

    def call(attn):
        if backward:  # a training step's work: forward and backward
            attn(x).sum().backward()
        else:
            with torch.no_grad():
                attn(x)

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for attn in heads.values():
            call(attn)  # warm-up
        best = {fn: math.inf for fn in heads}
        for _ in range(reps):
            for fn, attn in heads.items():
                t0 = time.thread_time()
                for _ in range(calls):
                    call(attn)
                best[fn] = min(best[fn], (time.thread_time() - t0) / calls)
    finally:
        torch.set_num_threads(threads)
    return best
# --8<-- [end:cost]


# %% [markdown]
# ## 2. The logits at initialisation, as d_k grows
#
# One head (d_k = d_model) with orthogonal W_Q and W_K and inputs from N(0, I), so
# that q and k have the unit-variance components of the √d_k page; every arm gets
# the same W_Q, W_K and inputs at one seed. The additive head's v is drawn
# N(0, 1/d_k) (the module's own initialisation, a fan-in scaling); `v_std=1.0`
# draws it N(0, 1) instead, to see what that scaling does.

# %%
# --8<-- [start:logits]
@lru_cache(maxsize=None)
def orthogonal_pair(d_k: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """W_Q, W_K: orthogonal (d_k, d_k), the same for every arm at one seed (and computed once)."""
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.linalg.qr(torch.randn(d_k, d_k, generator=g))[0] for _ in range(2))


def unit_head(d_k: int, seed: int, v_std: float | None = None, **switches):
    torch.manual_seed(seed)  # the additive head's v: N(0, 1/d_k), the module's own initialisation
    attn = make_self_attention(TransformerConfig(d_model=d_k, n_heads=1, bias=False, attn_impl="explicit", **switches))
    w_q, w_k = orthogonal_pair(d_k, seed)  # q, k with i.i.d. N(0, 1) components for x ~ N(0, I)
    with torch.no_grad():
        attn.w_q.weight.copy_(w_q)
        attn.w_k.weight.copy_(w_k)
        if v_std is not None:
            attn.v.normal_(0.0, v_std)  # additive only: override v's N(0, 1/d_k)
    return attn.eval()


def logit_statistics(d_k: int, seed: int, v_std: float | None = None, batch: int = 4, n_queries: int = 32,
                     n_keys: int = 16, **switches) -> dict:
    """Spread of the logits over the keys, their largest size, the softmax peak and Jacobian norm."""
    attn = unit_head(d_k, seed, v_std, **switches)
    g = torch.Generator().manual_seed(seed)  # the same inputs for every arm
    x, kv = torch.randn(batch, n_queries, d_k, generator=g), torch.randn(batch, n_keys, d_k, generator=g)
    with torch.no_grad(), record_attention(attn):
        attn(x, kv)
        q, k, _ = attn.project(x, kv)
        s = attn.score(q, k)  # (B, 1, Tq, Tk): the logits softmax sees
        p = attn.weights
    jac = torch.diag_embed(p) - p[..., :, None] * p[..., None, :]  # softmax Jacobian of every row
    return {
        "row_std": s.std(-1).mean().item(),  # spread over the keys of one query: what the softmax sees
        "max_abs": s.abs().max().item(),
        "v_l1": attn.v.abs().sum().item() if hasattr(attn, "v") else math.inf,  # the additive bound ||v||_1
        "v_l2": attn.v.norm().item() if hasattr(attn, "v") else math.nan,  # Var(e_ij) <= ||v||_2^2
        "max_weight": p.max(-1).values.mean().item(),
        "jacobian_norm": jac.flatten(-2).norm(dim=-1).mean().item(),
    }
# --8<-- [end:logits]


# %% [markdown]
# ## 3. A training run: three scores, same data
#
# The reverse task (output the sequence backwards: it needs attention to a position
# that depends on where the query stands): one encoder layer with one head of size
# d_k = 64, 300 Adam steps at learning rate 3e-3, batch 16, length 8, the same
# batches for every arm; only the score function changes. Each arm is trained from
# INITS initialisations per seed (cached) and its accuracy averaged: a stall is a
# delay whose length varies from one initialisation to the next (see the thresholds).

# %%
# --8<-- [start:train]
INITS = 2  # initialisations per arm and seed, same batches: the test reads their mean


@cache
def reverse_accuracy(arm: str, seed: int, steps: int = 300, d_model: int = 64, length: int = 8, init: int = 0) -> float:
    """Accuracy on 256 new sequences after `steps` Adam steps; one head (d_k = d_model), one layer. `init` picks
    the initialisation (0: torch.manual_seed(seed)); the batches and the test set depend on `seed` alone."""
    torch.manual_seed(seed + 100_003 * init)
    cfg = TransformerConfig(vocab_size=16, d_model=d_model, n_heads=1, d_ff=2 * d_model, n_layers=1,
                            dropout_emb=0.0, dropout_residual=0.0, **ARMS[arm])
    model = EncoderTagger(cfg)
    train(model, fixed_batches(reverse_task, 1000 + seed, batch=16, length=length, vocab=16), steps, lr=3e-3)
    x, y = reverse_task(torch.Generator().manual_seed(10_000 + seed), 256, length, 16)
    return accuracy(model, x, y)
# --8<-- [end:train]


# %%
if __name__ == "__main__":  # notebook / script: flip a switch above and rerun
    for n in LENGTHS:
        print(n, attention_cost(n, "dot"), attention_cost(n, "additive"))
    print({n: best_times(n) for n in TIMED})
    for d in D_KS:
        print(d, {arm: logit_statistics(d, 0, **sw)["row_std"] for arm, sw in ARMS.items()})
    print({arm: reverse_accuracy(arm, 0) for arm in ARMS})


# %% [markdown]
# ## Tests: each asserts the difference the switch makes

# %%
import pytest  # noqa: E402

# --8<-- [start:thresholds]
# Thresholds, set from the seed sweeps recorded in bench/seeds/attention/proof_dot_vs_additive.json.
# Timing is CPU time of one torch thread (see best_times), not a statistic of the seed: its spread is the machine's.
# Measured under full load (four busy loops on the two cores plus other torch work, torch at its default thread
# count, 5 runs): additive / dot at n = 64 was 1.95-6.92 forward and 2.62-3.38 forward + backward; at n = 256,
# 17.9-46.9 forward and 9.5-25.9 forward + backward (alone and idle: about 26 and 18). Wall-clock timing with
# two threads fell below 1.2 at n = 64 on a loaded machine, which is why the clock is the thread's own.
THRESHOLD_N64 = 1.2
THRESHOLD_N256 = 3.0
# Logits (seeds 100-139, mean ± sd of each asserted statistic): unscaled growth 7.95 ± 0.20; scaled growth
# min 0.994 ± 0.026, max 1.054 ± 0.022; additive flatness 1.24 ± 0.08; additive spread min 0.42 ± 0.04, max
# 0.65 ± 0.05; unscaled peak 0.951 ± 0.007; additive/scaled peak 0.252 ± 0.006; Jacobian ratio 4.2 ± 0.6;
# additive with v ~ N(0, 1) peak 0.909 ± 0.012. Every threshold is at least 4 sd from its mean. The additive
# spread's lower bound is 0.15, not 0.25: it is a minimum over sizes and three seeds, whose lower tail is longer
# than its sd says (one seed of a 20-seed sweep on 2026-11-25 reached 0.245).
THRESHOLDS_LOGITS = {"unscaled growth": 6, "scaled growth": (0.85, 1.2), "flat": 1.6, "additive spread": (0.15, 1.0),
                     "saturated": 0.9, "soft": 0.5, "jacobian": 1.5, "v saturated": 0.85}
# Training. A stall is a delay whose length varies with the initialisation, on both sides: at 200 steps (the budget
# until 2026-11-28, one initialisation per arm) seeds 100-159 gave additive − unscaled 0.80 ± 0.04 and scaled − unscaled
# 0.78 ± 0.07, yet at --proof-seed 31415926 the scaled arm was still on its plateau at step 200 (accuracy 0.34; 0.89 at
# 250, 0.98 at 300) while the unscaled one stayed stuck (0.16 at 300). At 300 steps, one initialisation, seeds 100-159:
# additive 0.998 ± 0.011 (min 0.94), scaled 0.992 ± 0.009 (min 0.96), unscaled 0.19 ± 0.07, but seed 141's unscaled arm
# escaped its stall between steps 200 and 300 (0.51 at 250, 0.66 at 300). So the test averages INITS = 2 initialisations
# per arm. By arithmetic on the observed ranges, the bounds hold against any ONE anomalous run of a seed, not two: the
# learning arms' runs were all ≥ 0.925 (their means ≥ 0.96), so a fully escaped unscaled run (accuracy 1) beside a stuck
# one below 0.42 leaves both gaps over the unscaled arm above the bound, 0.25; an unscaled escape and a learning-arm
# stall on the same seed would not pass. Two initialisations, seeds 100-159 (60/60 pass): additive − unscaled 0.811 ±
# 0.048 (min 0.577), scaled − unscaled 0.805 ± 0.048 (min 0.564), additive − scaled 0.007 ± 0.009 (from −0.025 to
# +0.029). Additive − scaled: one initialisation 0.006 ± 0.012 (−0.057 to +0.034); its bound, 0.45, also holds if one
# scaled run of two sat on its plateau at 0.34 like the far seed's did at 200 steps (just, if at 0.18), and lies far
# below the ~0.8 by which both beat the unscaled dot product. Spread of the two-initialisation means:
# bench/seeds/attention/.
THRESHOLDS_TRAIN = {"additive − unscaled dot": 0.25, "scaled dot − unscaled dot": 0.25, "additive − scaled dot": 0.45}
# --8<-- [end:thresholds]



def _plot_cost(ev, rows):
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.2))
    for fn, style in (("dot", "o-"), ("additive", "s--")):
        axes[0].loglog(LENGTHS, [r[fn]["matmul_flops"] + r[fn]["elementwise"] for r in rows], style,
                       label=f"{fn}: matmul (counted) + elementwise (formula)")
        axes[1].loglog(LENGTHS, [4 * r[fn]["largest"] for r in rows], style, label=fn)
    axes[0].loglog(LENGTHS, [rows[-1]["dot"]["matmul_flops"] * (n / LENGTHS[-1]) ** 2 for n in LENGTHS], ":",
                   color="grey", label="∝ n²")
    axes[0].set(title="operations, one head, d_k = 64", xlabel="n (tokens)")
    axes[1].set(title="largest tensor (bytes, fp32)", xlabel="n (tokens)")
    for ax in axes:
        ax.set_xticks(LENGTHS, [str(n) for n in LENGTHS])
        ax.minorticks_off()
    axes[0].legend(fontsize=8)
    axes[1].legend(fontsize=8)
    fig.tight_layout()
    ev.figure(fig, "cost", "Operations (matmul FLOPs counted, elementwise ops from a formula) and the largest tensor "
                           "of one attention head of our module against sequence length (below n = d_k the dot "
                           "product's largest tensor is a d_k × d_k weight).")


# --8<-- [start:test_cost]
@pytest.mark.claim("C-DOT-1", "confirmed")
def test_both_quadratic_additive_does_more_and_stores_n_n_dk(ev, seed):
    """Counts of our module: both heads' work grows as n²; the matmul FLOPs are equal, and the additive score adds
    2·n²·d_k elementwise operations and an (n, n, d_k) tensor. Would be refuted if either count grew faster than n²
    or the dot head built a tensor as large as the additive one."""
    d = 64
    rows = [{fn: attention_cost(n, fn, d) for fn in ("dot", "additive")} for n in LENGTHS]
    _plot_cost(ev, rows)
    for n, row in zip(LENGTHS, rows):
        dot, add = row["dot"], row["additive"]
        # exact: 4 projections (2·n·d² each) + the score contraction (2·n²·d) + weights × values (2·n²·d)
        assert dot["matmul_flops"] == add["matmul_flops"] == 8 * n * d * d + 4 * n * n * d
        assert add["largest"] == n * n * d  # the (n, n, d_k) tensor q_i + k_j, then tanh of it
        assert dot["largest"] == max(n * n, d * d)  # the (n, n) score matrix (a (d_k, d_k) weight while n < d_k)
        if n not in (16, 256):
            continue
        ev.record(f"matmul FLOPs (FlopCounterMode, count of our module), n={n}, dot = additive",
                  dot["matmul_flops"], expect="equal: the counter sees only matmuls", key=n == 256)
        score = {"dot": 2 * n * n * d + dot["elementwise"], "additive": 2 * n * n * d + add["elementwise"]}
        ev.record(f"score ops additive / dot, n={n} (formula from shapes, a tanh counted as one op)",
                  score["additive"] / score["dot"], expect="4·d_k / (2·d_k + 1) ≈ 2", key=n == 256)
        ev.record(f"all ops additive / dot, n={n} (counted matmuls + formula)", (add["matmul_flops"] + add["elementwise"])
                  / (dot["matmul_flops"] + dot["elementwise"]), expect="a constant factor < 1.5", key=n == 256)
        ev.record(f"largest tensor additive / dot, n={n} (recorded in our module)", add["largest"] / dot["largest"],
                  expect="d_k = 64 once n ≥ d_k", key=n == 256)
    # O(n²): doubling n multiplies every count by less than 4 and by more than 2 (the projections are linear in n)
    for fn in ("dot", "additive"):
        total = [r[fn]["matmul_flops"] + r[fn]["elementwise"] for r in rows]
        ratios = [b / a for a, b in zip(total, total[1:])]
        assert all(2 < r < 4 for r in ratios) and ratios == sorted(ratios)  # approaching 4 from below
# --8<-- [end:test_cost]


# --8<-- [start:test_time]
@pytest.mark.claim("C-DOT-1", "confirmed")
def test_dot_product_is_faster_measured_side_by_side(ev, seed):
    """Measured, not derived: the two heads timed alternately in one process; the additive head takes several
    times as long, forward and forward + backward, at n = 64 and 256. Would be refuted if the ratio of best times
    fell to 1 or below (the extra elementwise work costing nothing next to the matmul)."""
    ratios = {}
    for n in TIMED:
        for mode, backward in (("forward", False), ("forward + backward", True)):
            t = best_times(n, backward=backward)
            ratios[n, mode] = t["additive"] / t["dot"]
            ev.record(f"CPU time additive / dot, {mode}, n={n} (one thread, best of 12, alternating)", ratios[n, mode],
                      expect="> 1: dot is faster", key=n == 256)
    # Thresholds from the seed sweep (bench/seeds/attention/proof_dot_vs_additive.json), run with both cores busy
    # with other work: the smallest ratio there sets them, with a wide margin (timings, not statistics of a seed).
    assert min(ratios[64, m] for m in ("forward", "forward + backward")) > THRESHOLD_N64
    assert min(ratios[256, m] for m in ("forward", "forward + backward")) > THRESHOLD_N256
# --8<-- [end:test_time]


def _plot_logits(ev, stats):
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.2))
    for arm, style in zip(stats, ("s-", "o-", "^--", "x:")):
        axes[0].loglog(D_KS, [stats[arm][d]["row_std"] for d in D_KS], style, label=arm)
        axes[1].semilogx(D_KS, [stats[arm][d]["max_weight"] for d in D_KS], style, label=arm)
    axes[0].set(title="spread of the logits over the keys (std)", xlabel="d_k")
    axes[1].set(title="mean largest softmax weight (16 keys)", xlabel="d_k", ylim=(0, 1.05))
    for ax in axes:
        ax.set_xticks(D_KS, [str(d) for d in D_KS])
        ax.minorticks_off()
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    ev.figure(fig, "logits", "Logit spread and softmax peak at initialisation against d_k: additive, "
                             "scaled and unscaled dot product, and additive with v drawn N(0, 1).")


# --8<-- [start:test_logits]
@pytest.mark.claim("C-DOT-2", "confirmed")
@pytest.mark.claim("C-FOLK-4", "nuanced")
def test_additive_logits_do_not_grow_with_d_k(ev, seed):
    """At initialisation, unscaled q·k spreads as √d_k and saturates the softmax; additive logits, like scaled ones,
    keep a spread of order 1 at every d_k. Would be refuted if the additive spread grew with d_k as the unscaled
    one does, or if the unscaled rows stayed soft at d_k = 1024."""
    arms = {**ARMS, "additive, v ~ N(0, 1)": {"score_fn": "additive", "v_std": 1.0}}
    seeds = [seed, seed + 1, seed + 2]
    runs = [{arm: {d: logit_statistics(d, s, **sw) for d in D_KS} for arm, sw in arms.items()} for s in seeds]
    _plot_logits(ev, runs[0])
    grows = {"dot, unscaled": "grows as √d_k", "additive, v ~ N(0, 1)": "grows as √d_k"}
    for arm in arms:
        for d in (16, 1024):
            ev.record(f"logit spread, {arm}, d_k={d}", runs[0][arm][d]["row_std"], key=d == 1024,
                      expect=grows.get(arm, "flat in d_k"))

    def worst(f, pick=min):  # a statistic's worst case over the three seeds
        return pick(f(r) for r in runs)

    def growth(r, arm):
        return r[arm][1024]["row_std"] / r[arm][16]["row_std"]

    def per_v(r):  # spread per unit of ||v||_2 (Var(e) <= ||v||_2^2); one draw of v at d_k = 16 has a noisy norm
        return [r["additive"][d]["row_std"] / r["additive"][d]["v_l2"] for d in D_KS]

    # exact at every size and seed (a bound, by construction): |v·tanh(q_i + k_j)| <= ||v||_1
    assert all(r["additive"][d]["max_abs"] <= r["additive"][d]["v_l1"] for r in runs for d in D_KS)
    ev.record("largest |logit| / ||v||_1, additive, d_k=1024",
              runs[0]["additive"][1024]["max_abs"] / runs[0]["additive"][1024]["v_l1"], expect="≤ 1")
    m = {  # every asserted statistic, worst case over the three seeds (the seed sweep records their spread)
        "spread growth d_k 16 → 1024, unscaled dot (min of 3 seeds)": worst(lambda r: growth(r, "dot, unscaled")),
        "spread growth d_k 16 → 1024, scaled dot (min of 3 seeds)": worst(lambda r: growth(r, "dot, scaled")),
        "spread growth d_k 16 → 1024, scaled dot (max of 3 seeds)": worst(lambda r: growth(r, "dot, scaled"), max),
        "spread / ||v||_2, additive, largest over d_k (max of 3 seeds)": worst(lambda r: max(per_v(r)), max),
        "spread / ||v||_2, additive, largest / smallest over d_k (max of 3 seeds)":
            worst(lambda r: max(per_v(r)) / min(per_v(r)), max),
        "logit spread, additive, smallest over d_k (min of 3 seeds)":
            worst(lambda r: min(r["additive"][d]["row_std"] for d in D_KS)),
        "logit spread, additive, largest over d_k (max of 3 seeds)":
            worst(lambda r: max(r["additive"][d]["row_std"] for d in D_KS), max),
        "max softmax weight, unscaled dot, d_k=1024 (min of 3 seeds)":
            worst(lambda r: r["dot, unscaled"][1024]["max_weight"]),
        "max softmax weight, additive or scaled dot, d_k=1024 (max of 3 seeds)":
            worst(lambda r: max(r["additive"][1024]["max_weight"], r["dot, scaled"][1024]["max_weight"]), max),
        "softmax Jacobian norm, additive / unscaled dot, d_k=1024 (min of 3 seeds)":
            worst(lambda r: r["additive"][1024]["jacobian_norm"] / r["dot, unscaled"][1024]["jacobian_norm"]),
        "max softmax weight, additive with v ~ N(0, 1), d_k=1024 (min of 3 seeds)":
            worst(lambda r: r["additive, v ~ N(0, 1)"][1024]["max_weight"]),
    }
    for name, value in m.items():
        ev.record(name, value, key="growth" in name and "unscaled" in name)
    # thresholds: THRESHOLDS_LOGITS, from the spread over seeds 100-139 (see the comment there)
    lo, hi = THRESHOLDS_LOGITS["scaled growth"]
    assert m["spread growth d_k 16 → 1024, unscaled dot (min of 3 seeds)"] > THRESHOLDS_LOGITS["unscaled growth"]
    assert lo < m["spread growth d_k 16 → 1024, scaled dot (min of 3 seeds)"]
    assert m["spread growth d_k 16 → 1024, scaled dot (max of 3 seeds)"] < hi
    assert m["spread / ||v||_2, additive, largest over d_k (max of 3 seeds)"] < 1  # Var(e) <= ||v||_2^2
    assert m["spread / ||v||_2, additive, largest / smallest over d_k (max of 3 seeds)"] < THRESHOLDS_LOGITS["flat"]
    lo, hi = THRESHOLDS_LOGITS["additive spread"]
    assert lo < m["logit spread, additive, smallest over d_k (min of 3 seeds)"]
    assert m["logit spread, additive, largest over d_k (max of 3 seeds)"] < hi
    assert m["max softmax weight, unscaled dot, d_k=1024 (min of 3 seeds)"] > THRESHOLDS_LOGITS["saturated"]
    assert m["max softmax weight, additive or scaled dot, d_k=1024 (max of 3 seeds)"] < THRESHOLDS_LOGITS["soft"]
    assert m["softmax Jacobian norm, additive / unscaled dot, d_k=1024 (min of 3 seeds)"] > THRESHOLDS_LOGITS["jacobian"]
    # the fan-in scaling of v does for additive what 1/√d_k does for q·k: drop it and additive saturates too
    assert m["max softmax weight, additive with v ~ N(0, 1), d_k=1024 (min of 3 seeds)"] > THRESHOLDS_LOGITS["v saturated"]
# --8<-- [end:test_logits]


# --8<-- [start:test_train]
@pytest.mark.claim("C-DOT-2", "confirmed")
@pytest.mark.claim("C-FOLK-4", "nuanced")
def test_additive_beats_only_the_unscaled_dot_product(ev, seed):
    """At d_k = 64 additive attention learns the reverse task where the unscaled dot product stalls; the scaled dot
    product learns as well, and additive does not beat it. Would be refuted (C-DOT-2) if additive did not beat the
    unscaled arm; the folk claim (additive better at large d, scale or not) would be confirmed if additive beat the
    scaled arm by a margin like the one it has over the unscaled arm."""
    runs = {arm: [reverse_accuracy(arm, seed, init=i) for i in range(INITS)] for arm in ARMS}
    acc = {arm: sum(r) / INITS for arm, r in runs.items()}
    for arm, value in acc.items():
        ev.record(f"reverse accuracy, {arm} (mean of {INITS} initialisations)", value,
                  expect="stalls near chance (1/15) plus position luck" if arm == "dot, unscaled" else "learns")
        ev.record(f"reverse accuracy, {arm}, each initialisation", runs[arm], key=False)
    gaps = {
        "additive − unscaled dot": acc["additive"] - acc["dot, unscaled"],
        "scaled dot − unscaled dot": acc["dot, scaled"] - acc["dot, unscaled"],
        "additive − scaled dot": acc["additive"] - acc["dot, scaled"],
    }
    for name, gap in gaps.items():
        ev.record(f"accuracy gap, {name}", gap)
    # thresholds: THRESHOLDS_TRAIN (the comment there gives the spread and why they hold against one escaped stall)
    assert gaps["additive − unscaled dot"] > THRESHOLDS_TRAIN["additive − unscaled dot"]  # C-DOT-2
    assert gaps["scaled dot − unscaled dot"] > THRESHOLDS_TRAIN["scaled dot − unscaled dot"]  # the scale closes it
    assert gaps["additive − scaled dot"] < THRESHOLDS_TRAIN["additive − scaled dot"]  # ... additive does not win
# --8<-- [end:test_train]
