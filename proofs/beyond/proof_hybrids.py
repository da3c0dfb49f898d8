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
# 2. trained: recall on multi-query associative recall (MQAR, fused format of `proofs/mqar.py`) with more pairs
#    than the recurrent layers' state has dimensions, per stack, at equal steps (the set-up is
#    `proofs/hybrid_runs.py`).
#
# Run: `pytest proofs/beyond/proof_hybrids.py`.

# %%
from __future__ import annotations

from functools import lru_cache

import torch

import proofs.hybrid_runs as H

SOFTMAX, HYBRID, LINEAR, SSM = ("softmax", "softmax"), ("softmax", "linear"), ("linear", "linear"), ("ssm", "ssm")
PAIRS = 2 * H.WIDTH  # stored pairs: twice the side of the recurrent layers' d×d state
INITS = 2  # initialisations (and data streams) of the hybrid, whose single runs are noisy


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
# Every stack trains on the same batches (one seed) for the same steps; recall is the share of queries answered
# exactly on a fresh held-out batch. With `PAIRS` = 2d pairs no d×d state can hold them all (the exact bound is on the
# linear-attention page); a softmax layer keeps every pair in its cache.

# %%
# --8<-- [start:recall]
@lru_cache(maxsize=None)
def trained(stack: tuple, seed: int) -> dict:
    return H.trained_recall(stack, PAIRS, seed)
# --8<-- [end:recall]


# %%
if __name__ == "__main__":
    print(memory(0))
    for s in (SOFTMAX, HYBRID, LINEAR, SSM):
        print(name(s), trained(s, 0))


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
    """Trained (fused MQAR, 2d pairs, equal width, steps and batches): the stack with one softmax layer and one
    linear layer recalls far better than the all-linear stack. At 150 steps an attention arm sometimes has not yet
    learned to retrieve (single runs of the hybrid spread from 0.35 to 0.91 over seeds 100-139), so the hybrid is
    trained from INITS initialisations and data streams and its mean recall is compared. The gap to the all-softmax
    stack is recorded, not asserted: per seed it is noise of the same size. Would be refuted if the hybrid's mean
    recall were no better than the all-linear stack's (one softmax layer not enough to retrieve)."""
    hybrid = [trained(HYBRID, seed + 5000 * i) for i in range(INITS)]
    soft, lin = trained(SOFTMAX, seed), trained(LINEAR, seed)
    hyb = sum(h["recall"] for h in hybrid) / INITS
    ev.record("recall, softmax + softmax", soft["recall"])
    ev.record(f"recall, softmax + linear (mean of {INITS} initialisations)", hyb)
    ev.record("recall, softmax + linear, each initialisation", [h["recall"] for h in hybrid], key=False)
    ev.record("recall, linear + linear", lin["recall"])
    ev.record("seconds per run: softmax, hybrid, linear", (soft["seconds"], hybrid[0]["seconds"], lin["seconds"]),
              key=False)
    ev.record("parameters per stack", [soft["params"], hybrid[0]["params"], lin["params"]], key=False)
    ev.record("hybrid minus all-linear", hyb - lin["recall"])
    ev.record("all-softmax minus hybrid", soft["recall"] - hyb)
    ev.record("chance (1 / values)", 1 / H.VALUES, key=False)
    # Seeds 100-139 (40/40 pass): hybrid − all-linear 0.281 ± 0.081 (min 0.091, max 0.440); the bound 0 is 3.5 sd
    # below the mean and below the min (it was 0.05, 2.9 sd: too thin; the recorded runs are unchanged).
    # Hybrid (mean of 2) 0.644 ± 0.076, all-softmax 0.664 ± 0.101, all-linear 0.363 ± 0.042:
    # on average the hybrid closes (0.644 − 0.363)/(0.664 − 0.363) ≈ 93 % of the gap; all-softmax − hybrid per seed
    # 0.020 ± 0.134 (min −0.308, max 0.361), hence recorded, not asserted. Single hybrid runs: 0.353 to 0.906.
    assert hyb - lin["recall"] > 0


@pytest.mark.claim("C-FOLK-29", "refuted")
def test_selective_ssm_recalls_worse_than_attention_at_equal_size(ev, seed):
    """Trained (fused MQAR, 2d pairs, same width, steps and batches; the SSM stack has slightly MORE parameters): the
    all-SSM stack, whose decoding state is constant, stays near chance and below the all-softmax stack. Would have
    confirmed the folk answer if the SSM stack recalled as well as the softmax stack or clearly above chance."""
    soft, ssm = trained(SOFTMAX, seed), trained(SSM, seed)
    ev.record("recall, softmax + softmax", soft["recall"])
    ev.record("recall, ssm + ssm", ssm["recall"])
    ev.record("parameters: softmax stack, ssm stack", (soft["params"], ssm["params"]), key=False)
    ev.record("seconds, ssm + ssm", ssm["seconds"], key=False)
    ev.record("softmax minus ssm", soft["recall"] - ssm["recall"])
    # Seeds 100-139 (40/40 pass): ssm + ssm 0.306 ± 0.034 (min 0.240, max 0.383; chance 0.25), 0.5 is 5.6 sd above;
    # softmax − ssm 0.359 ± 0.109 (min 0.106, max 0.536), 0 is 3.3 sd below; softmax + softmax 0.664 ± 0.101.
    assert ssm["recall"] < 0.5  # near chance (0.25)
    assert soft["recall"] - ssm["recall"] > 0
    assert ssm["params"] >= soft["params"]

