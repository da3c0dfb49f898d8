# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% [markdown]
# # The delta rule against the additive state, trained: distinct keys and rewritten keys
#
# Proof for `docs/beyond/delta-rule.md` (proof 5). One shared `DecoderLM` (`mixer_lm`), one layer, one head of width
# 16, the `DeltaRule` mixer with one switch: `delta_erase` (True: the delta rule; False: the additive state
# S += β v kᵀ with the same unit keys, values and learned β). Two tasks, the set-ups in `proofs/recall_curves.py`:
#
# 1. fused MQAR with distinct keys, pair counts 2…32 mixed in training, recall at each count;
# 2. the same task with every key written twice (a different value the second time), recall of the latest value.
#
# Each arm trains on the same batches for the same steps.
# Run: `pytest proofs/beyond/proof_delta_recall.py`.

# %%
from __future__ import annotations

from functools import lru_cache

import proofs.recall_curves as R

ARMS = ("additive", "delta")
SMALL, LARGE = min(R.PAIRS), max(R.PAIRS)
FROM = R.WIDTH  # the curve's far half: pair counts ≥ the state's side
DISTINCT_GAP = 0.15  # |delta − additive| past d pairs, distinct keys: at most this either way (spread: the test)
REWRITE_GAP = 0.1  # delta − additive with rewritten keys: at least this
DROP = 0.2  # each arm's recall falls by at least this from 2 to 32 pairs


# %%
# --8<-- [start:runs]
@lru_cache(maxsize=None)
def curves(seed: int) -> dict:
    """Distinct keys: recall against pairs for each arm (same batches, same steps)."""
    return {arm: R.recall_curve(arm, seed) for arm in ARMS}


@lru_cache(maxsize=None)
def rewrites(seed: int) -> dict:
    """Every key written twice: recall of the value written last, for each arm."""
    return {arm: R.rewrite_recall(arm, seed) for arm in ARMS}
# --8<-- [end:runs]


# %%
if __name__ == "__main__":
    for arm, r in curves(0).items():
        print(arm, {n: round(v, 3) for n, v in r["recall"].items()}, "rewrites:", round(rewrites(0)[arm]["recall"], 3))


# %% [markdown]
# ## Tests

# %%
import pytest  # noqa: E402


def far(curve: dict) -> float:
    """Mean recall over the pair counts at or past the state's side."""
    return sum(v for n, v in curve.items() if n >= FROM) / sum(n >= FROM for n in curve)


@pytest.mark.claim("C-LIN-3", "nuanced")
def test_with_distinct_keys_the_erase_term_does_not_raise_capacity(ev, seed):
    """Trained, distinct keys (nothing is ever rewritten): both states fall as the pairs grow, and the delta rule's
    mean recall past the state's side is within DISTINCT_GAP of the additive state's, either way. Would have confirmed
    the popular answer ("the delta rule recalls better because its capacity is larger") if the delta arm recalled
    clearly more than the additive one past d pairs, and refuted the erase term's value outright if it recalled
    clearly less."""
    r = curves(seed)
    for n in R.PAIRS:
        ev.record(f"recall at {n} pairs: additive, delta", tuple(r[a]["recall"][n] for a in ARMS))
    for a in ARMS:
        ev.record(f"{a}: drop from {SMALL} to {LARGE} pairs", r[a]["recall"][SMALL] - r[a]["recall"][LARGE])
    gap = far(r["delta"]["recall"]) - far(r["additive"]["recall"])
    ev.record(f"delta minus additive, mean recall at ≥ {FROM} pairs", gap)
    ev.record("parameters: additive, delta", tuple(r[a]["params"] for a in ARMS), key=False)
    ev.record("seconds: additive, delta", tuple(r[a]["seconds"] for a in ARMS), key=False)
    _plot(ev, r, rewrites(seed))
    # Seeds 100-139 (40/40 pass): delta − additive, mean recall at ≥ 16 pairs, −0.004 ± 0.032 (min −0.069, max
    # 0.071): the bound 0.15 is 4.5 sd from the mean either way. Drops from 2 to 32 pairs: additive 0.388 ± 0.023,
    # delta 0.409 ± 0.025 (min 0.348); the bound 0.2 is 7.5 sd below the smaller mean.
    for a in ARMS:
        assert r[a]["recall"][SMALL] - r[a]["recall"][LARGE] > DROP
    assert abs(gap) < DISTINCT_GAP


@pytest.mark.claim("C-LIN-3", "nuanced")
def test_when_keys_are_rewritten_the_delta_rule_recalls_the_latest_value(ev, seed):
    """Trained, every key written twice with different values: the delta arm recalls the latest value far more often
    than the additive arm, which holds the sum of both. Would be refuted if the erase term gave no gain here, where
    it is the only difference between the arms."""
    r = rewrites(seed)
    ev.record(f"recall of the latest value, {R.REWRITE_PAIRS} keys written twice: additive, delta",
              (r["additive"]["recall"], r["delta"]["recall"]))
    ev.record("delta minus additive", r["delta"]["recall"] - r["additive"]["recall"])
    ev.record("chance (1 / values)", 1 / R.VALUES, key=False)
    ev.record("seconds: additive, delta", tuple(r[a]["seconds"] for a in ARMS), key=False)
    # Seeds 100-139 (40/40 pass): delta − additive 0.285 ± 0.042 (min 0.161); the bound 0.1 is 4.4 sd below the mean.
    # At 150 steps instead of 200 (seeds 140-143, not recorded) the gap was 0.10-0.23: the rule's use is learned.
    assert r["delta"]["recall"] - r["additive"]["recall"] > REWRITE_GAP


def _plot(ev, r: dict, rw: dict):
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(1, 2, figsize=(7.5, 3.2), constrained_layout=True, width_ratios=(3, 1))
    for arm, style in (("additive", "s-"), ("delta", "o-")):
        ax[0].plot(list(R.PAIRS), [r[arm]["recall"][n] for n in R.PAIRS], style, ms=4, label=arm)
    ax[0].axvline(R.WIDTH, color="grey", lw=0.8, ls="--")
    ax[0].axhline(1 / R.VALUES, color="grey", lw=0.8, ls=":")
    ax[0].set(xlabel="key-value pairs (distinct keys)", ylabel="recall (held-out queries)", ylim=(0, 1.02))
    ax[0].legend(fontsize=7)
    ax[1].bar(list(ARMS), [rw[a]["recall"] for a in ARMS], color=["C0", "C1"])
    ax[1].axhline(1 / R.VALUES, color="grey", lw=0.8, ls=":")
    ax[1].set(title="keys written twice", ylim=(0, 1.02))
    ax[1].title.set_fontsize(8)
    ev.figure(fig, "curves", "Left: recall against pairs with distinct keys. Right: recall of the latest value when "
                             "every key is written twice. One DeltaRule layer, erase term on (delta) or off (additive); "
                             "same batches and steps.")
