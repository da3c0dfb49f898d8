# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% [markdown]
# # Why hybrids? A few full-attention layers among linear or state-space layers
#
# Proofs for `docs/beyond/hybrids.md`. One shared `DecoderLM` (`mixer_lm`), one switch: `MixerConfig.mixer`, a
# tuple with one mixer per layer. Four two-layer stacks of the same width, FFN, embeddings, steps and batches:
# `("softmax", "softmax")`, `("softmax", "linear")` (the hybrid), `("linear", "linear")` and `("ssm", "ssm")`.
# Two parts:
#
# 1. exact, untrained: the decoding memory of each stack (`state_bytes` of the caches `mixer_lm` gives them),
#    counted while decoding token by token, and the last logits against one full forward pass (fp64);
# 2. trained: recall on multi-query associative recall (MQAR, fused format of `proofs/mqar.py`) against the number
#    of pairs, 2 up to twice the recurrent layers' state side, per stack, at equal steps and batches (the set-up is
#    `proofs/hybrid_runs.py`).
#
# Run: `pytest proofs/beyond/proof_hybrids.py`.

# %%
from __future__ import annotations

from functools import lru_cache

import torch

import proofs.hybrid_runs as H

SOFTMAX, HYBRID, LINEAR, SSM = ("softmax", "softmax"), ("softmax", "linear"), ("linear", "linear"), ("ssm", "ssm")
SMALL, LARGE = min(H.PAIRS), max(H.PAIRS)  # the ends of the curves: 2 pairs, and 2d pairs
FROM = H.WIDTH  # the far half of the curve: pair counts ≥ the state's side d
HYB_GAP = 0.0  # hybrid − all-linear, mean recall past d pairs: above this (spread: the test)
FLAT_GAP = 0.1  # all-linear's drop from 2 to 2d pairs minus the hybrid's: above this
SSM_GAP = 0.15  # all-softmax − all-SSM, mean recall past d pairs: above this


def name(stack: tuple) -> str:
    return " + ".join(stack)


# %% [markdown]
# ## 1. Decoding memory per stack
#
# Each stack decodes a random sequence one token at a time through `model.decoder.new_cache()`; `state_bytes`
# reads the caches after 16 and 48 tokens. A softmax layer caches a key and a value of width d per token; a linear
# layer keeps one d×d matrix and a d-vector; an SSM layer keeps d channels × N states. A 4-layer stack with
# three linear layers and one softmax layer (Qwen3-Next's 3 : 1 layout) joins the 2-layer ones.

# %%
# --8<-- [start:memory]
LAYOUTS = (SOFTMAX, HYBRID, LINEAR, SSM, ("linear", "linear", "linear", "softmax"))


def memory(seed: int, lengths=(8, 16, 24, 32, 40, 48)) -> dict:
    return {name(s): H.decode_bytes(s, lengths, seed) for s in LAYOUTS}
# --8<-- [end:memory]


# %% [markdown]
# ## 2. Recall per stack, trained
#
# Every stack trains on the same batches (one seed) for the same steps, with 2 to 16 pairs per sequence mixed; recall
# is the share of queries answered exactly on fresh held-out batches at each pair count. Past d pairs no d×d state
# can hold them all (the exact bound is on the linear-attention page); a softmax layer keeps every pair in its cache.

# %%
# --8<-- [start:recall]
@lru_cache(maxsize=None)
def trained(stack: tuple, seed: int) -> dict:
    return H.trained_curve(stack, seed)


def far(curve: dict) -> float:
    """Mean recall over the pair counts at or past the state's side d."""
    return sum(v for n, v in curve.items() if n >= FROM) / sum(n >= FROM for n in curve)
# --8<-- [end:recall]


# %%
if __name__ == "__main__":
    print(memory(0))
    for s in (SOFTMAX, HYBRID, LINEAR, SSM):
        print(name(s), {n: round(v, 3) for n, v in trained(s, 0)["recall"].items()})


# %% [markdown]
# ## Tests

# %%
import pytest  # noqa: E402


@pytest.mark.claim("C-HYBRID-1", "confirmed")
def test_decoding_memory_grows_only_with_the_attention_layers(ev, seed):
    """A count of our modules (fp64, 8 bytes a number): decoding token by token, a stack's memory is a constant
    (the recurrent layers' states) plus 2·d numbers per token for each softmax layer. So the all-linear and all-SSM
    stacks stay flat, the all-softmax stack grows by 2·L·d·8 bytes a token and a stack with one softmax layer in L by
    1/L of that. The last step's logits equal a full forward in every stack. Would be refuted by a recurrent stack
    whose bytes change with length, or by a hybrid growing at another rate than its attention layers alone."""
    r = memory(seed)
    d, per_layer = H.WIDTH, 2 * H.WIDTH * 8  # bytes per token of one softmax layer's cache
    for stack in LAYOUTS:
        b = r[name(stack)]["bytes"]
        growth = (b[48] - b[16]) / 32
        n_soft = stack.count("softmax")
        ev.record(f"{name(stack)}: bytes after 16, 48 tokens", (b[16], b[48]))
        ev.record(f"{name(stack)}: bytes per token", growth, expect=f"{n_soft}·2·d·8 = {n_soft * per_layer}")
        ev.record(f"{name(stack)}: |decode − full forward|", r[name(stack)]["decode vs full forward"],
                  expect="< 1e-9", key=False)
        assert growth == n_soft * per_layer
        assert b[16] - 16 * growth == sum(8 * (d * d + d) if m == "linear" else 8 * d * d if m == "ssm" else 0
                                          for m in stack)  # the constant part: d×d + d (linear), d×N, N = d (SSM)
        assert r[name(stack)]["decode vs full forward"] < 1e-9
    soft, hyb = r[name(SOFTMAX)]["bytes"], r[name(HYBRID)]["bytes"]
    ev.record("hybrid's growth per token / all-softmax's", (hyb[48] - hyb[16]) / (soft[48] - soft[16]), expect="1/2")
    _plot_memory(ev, r)


def _plot_memory(ev, r: dict):
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 3.2), constrained_layout=True)
    for stack in LAYOUTS:
        b = r[name(stack)]["bytes"]
        ax.plot(list(b), [v / 1024 for v in b.values()], marker="o", ms=3, label=name(stack))
    ax.set(xlabel="tokens decoded", ylabel="decoding memory (KiB, fp64)")
    ax.legend(fontsize=7)
    ev.figure(fig, "memory", "Decoding memory of each stack (state_bytes of mixer_lm's caches) as tokens are decoded "
                             "one at a time: flat for recurrent layers, a fixed slope per softmax layer.")


@pytest.mark.claim("C-HYBRID-1", "confirmed")
def test_one_softmax_layer_recovers_the_recall(ev, seed):
    """Trained (fused MQAR, 2 to 2d pairs mixed, equal width, steps and batches): past d pairs, the stack with one
    softmax layer and one linear layer recalls more than the all-linear stack, and its recall, like all-softmax's,
    falls far less as the pairs grow (less than half as far as the all-linear stack's). Would be refuted if the
    hybrid's recall past d pairs were no better than the all-linear stack's (one softmax layer not enough to
    retrieve), or if it fell with the pairs half as far as the all-linear stack's or more."""
    runs = {name(s): trained(s, seed) for s in (SOFTMAX, HYBRID, LINEAR)}
    for n in H.PAIRS:
        for stack, r in runs.items():
            ev.record(f"recall at {n} pairs, {stack}", r["recall"][n], key=n in (SMALL, LARGE))
    soft, hyb, lin = (far(runs[name(s)]["recall"]) for s in (SOFTMAX, HYBRID, LINEAR))
    for stack, v in zip(runs, (soft, hyb, lin)):
        ev.record(f"mean recall at ≥ {FROM} pairs, {stack}", v)
    ev.record(f"hybrid minus all-linear, mean recall at ≥ {FROM} pairs", hyb - lin)
    ev.record("share of the all-linear → all-softmax gap the hybrid closes", (hyb - lin) / (soft - lin), key=False)
    drops = {s: runs[name(s)]["recall"][SMALL] - runs[name(s)]["recall"][LARGE] for s in (SOFTMAX, HYBRID, LINEAR)}
    for s, drop in drops.items():
        ev.record(f"{name(s)}: drop from {SMALL} to {LARGE} pairs", drop)
    ev.record("all-linear's drop minus the hybrid's", drops[LINEAR] - drops[HYBRID])
    ev.record("chance (1 / values)", 1 / H.VALUES, key=False)
    ev.record("seconds per run: softmax, hybrid, linear", tuple(r["seconds"] for r in runs.values()), key=False)
    ev.record("parameters per stack", tuple(r["params"] for r in runs.values()), key=False)
    _plot_recall(ev, {**runs, name(SSM): trained(SSM, seed)})
    # Seeds 100-139, before the last assertion was added (40/40 pass): hybrid − all-linear past d pairs 0.345 ± 0.084
    # (min 0.170), the bound 0 is 4.1 sd below; drops from 2 to 16 pairs: all-linear 0.363 ± 0.047, hybrid 0.005 ±
    # 0.027, all-softmax 0.018 ± 0.031. The share of the gap closed, 1.03 ± 0.28 (min 0.51), is too noisy a ratio to
    # assert at 0.5 (1.9 sd), so the flat curve is asserted instead: all-linear's drop minus the hybrid's 0.358 ±
    # 0.057 (min 0.194), the bound 0.1 is 4.5 sd below; the hybrid's own drop 0.005 ± 0.027 (max 0.064). An absolute
    # bound of 0.12 on the hybrid's drop (4.3 sd) failed at --proof-seed 8675309 (0.124: a hybrid still learning to
    # retrieve, 0.71 at 2 pairs), so the hybrid's drop is bounded by half the all-linear stack's drop of the same seed
    # (there 0.124 against 0.358; over seeds 100-139 the largest hybrid drop, 0.064, is under a third of the smallest
    # all-linear drop, 0.228).
    assert hyb - lin > HYB_GAP
    assert drops[LINEAR] - drops[HYBRID] > FLAT_GAP
    assert drops[HYBRID] < drops[LINEAR] / 2


def _plot_recall(ev, runs: dict):
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 3.2), constrained_layout=True)
    for (label, r), style in zip(runs.items(), ("o-", "D-", "s-", "^-")):
        ax.plot(list(H.PAIRS), [r["recall"][n] for n in H.PAIRS], style, ms=4, label=label)
    ax.axvline(H.WIDTH, color="grey", lw=0.8, ls="--")
    ax.axhline(1 / H.VALUES, color="grey", lw=0.8, ls=":")
    ax.text(H.WIDTH, 0.3, " state side d = 8", fontsize=7, color="grey")
    ax.set(xlabel="key-value pairs in the sequence", ylabel="recall (held-out queries)", ylim=(0, 1.02))
    ax.legend(fontsize=7)
    ev.figure(fig, "recall", "Two-layer stacks of width 8, trained on the same fused MQAR batches (2 to 16 pairs "
                             "mixed) for the same steps: recall at each pair count.")


@pytest.mark.claim("C-FOLK-29", "refuted")
def test_selective_ssm_recalls_worse_than_attention_at_equal_size(ev, seed):
    """Trained (fused MQAR, 2 to 2d pairs mixed, same width, steps and batches; the SSM stack has slightly MORE
    parameters): past d pairs the all-SSM stack, whose decoding state is constant, recalls far less than the
    all-softmax stack. Its drop with the pairs is recorded, not asserted: it is low at every count (it has not learned
    to retrieve well even at 2 pairs), so the toy cannot tell a full state from slow learning, and a broken SSM would
    pass this test too; the SSM's arithmetic is held by the selective-scan page's exact proofs and tests/test_ssm.py.
    This test supports the verdict, which rests on the papers. Would have confirmed the folk answer if the SSM stack
    recalled as well as the softmax stack past d pairs."""
    soft, ssm = trained(SOFTMAX, seed), trained(SSM, seed)
    for n in H.PAIRS:
        ev.record(f"recall at {n} pairs, ssm + ssm", ssm["recall"][n], key=n in (SMALL, LARGE))
    gap = far(soft["recall"]) - far(ssm["recall"])
    ev.record(f"softmax minus ssm, mean recall at ≥ {FROM} pairs", gap)
    ev.record(f"ssm + ssm: drop from {SMALL} to {LARGE} pairs", ssm["recall"][SMALL] - ssm["recall"][LARGE])
    ev.record("parameters: softmax stack, ssm stack", (soft["params"], ssm["params"]), key=False)
    ev.record("seconds, ssm + ssm", ssm["seconds"], key=False)
    # Seeds 100-139 (40/40 pass): softmax − ssm past d pairs 0.477 ± 0.076 (min 0.283), the bound 0.15 is 4.3 sd
    # below. The SSM stack's drop from 2 to 16 pairs, 0.099 ± 0.059 (min −0.009), failed a bound of 0 on seed 139:
    # recorded only.
    assert gap > SSM_GAP
    assert ssm["params"] >= soft["params"]
