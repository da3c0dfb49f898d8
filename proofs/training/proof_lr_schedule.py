# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% [markdown]
# # The learning-rate schedule and its warm-up
#
# Proofs for the page `docs/training/learning-rate-warmup.md`. The schedule lives
# in the shared trainer (`proofs/train.py: noam_schedule`), as a multiplier for
# `torch.optim.lr_scheduler.LambdaLR`. Here it drives a real Adam optimizer and is
# checked against the paper's formula written out piece by piece. The warm-up
# experiment (does training need the ramp?) is in
# `proofs/normalisation/proof_pre_post_ln.py`, because its answer depends on where
# the LayerNorm sits.
# Run it with `pytest proofs/training/proof_lr_schedule.py`.

# %%
from __future__ import annotations

import pytest
import torch

from proofs.train import noam_schedule

PAPER = {"d_model": 512, "warmup": 4000}  # the base model of §5.3


# %% [markdown]
# ## 1. The rate an optimizer actually uses
#
# Build Adam on one parameter, attach LambdaLR with the schedule (base lr 1, so the
# multiplier *is* the rate), and read `param_groups[0]["lr"]` before every update:
# LambdaLR writes base_lr · schedule(its step count) there, and Adam's step reads it.
# Update number n (counting from 1, as the paper's step_num does) uses the rate
# read before it. LambdaLR's rate is a closed form of its own step count, never of
# the optimizer's state, so Adam need not take all 16,000 steps for the rates to be
# read; it takes real steps at a few update numbers, and what it moves the parameter
# by there is measured against the rate read. With a constant gradient of 1 both of
# Adam's bias-corrected moments are 1, so a step moves the parameter by
# lr / (1 + eps): the rate itself, to float rounding.

# %%
# --8<-- [start:driven]
def rates_set(schedule, steps: int, adam_at: tuple[int, ...] = ()) -> tuple[list[float], dict[int, float]]:
    """The rate LambdaLR(schedule) has put in Adam's parameter group before each update n = 1..steps, and, for each
    n in adam_at, the step Adam really takes at update n divided by that rate (1 when Adam applies it). Adam also
    steps at update 1: LambdaLR warns when it steps before the optimizer ever has."""
    w = torch.nn.Parameter(torch.zeros(1, dtype=torch.float64))  # float64: the step/rate ratio is 1 to ~1e-16
    opt = torch.optim.Adam([w], lr=1.0, betas=(0.9, 0.98), eps=1e-9)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, schedule)
    used, applied = [], {}
    for n in range(1, steps + 1):
        used.append(opt.param_groups[0]["lr"])
        if n == 1 or n in adam_at:
            before = w.item()
            w.grad = torch.ones_like(w)  # constant gradient: Adam's bias-corrected moments are both 1
            opt.step()
            applied[n] = (before - w.item()) * (1 + 1e-9) / used[-1]  # the step, over lr / (1 + eps)
        sched.step()
    return used, {n: applied[n] for n in adam_at}


def rates_used(d_model: int, warmup: int, steps: int) -> list[float]:
    """The rate Adam reads at updates 1..steps under LambdaLR(noam_schedule(d_model, warmup))."""
    return rates_set(noam_schedule(d_model, warmup), steps)[0]


def paper_rate(n: int, d_model: int, warmup: int) -> float:
    """§5.3, the two pieces written separately: a linear ramp up to step = warmup, then 1/√n."""
    if n <= warmup:
        return n * d_model**-0.5 * warmup**-1.5
    return d_model**-0.5 * n**-0.5
# --8<-- [end:driven]


# %%
if __name__ == "__main__":
    r = rates_used(**PAPER, steps=10_000)
    print("peak at update", max(range(len(r)), key=r.__getitem__) + 1, "value", max(r))


# %% [markdown]
# ## Tests

# %%
def _plot(ev, curves):
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 3.4))
    for (d, w), r in curves.items():
        ax.plot(range(1, len(r) + 1), r, label=f"d_model={d}, warmup={w}")
        ax.plot([w], [d**-0.5 * w**-0.5], "k.", ms=6)
    ax.set(title="learning rate Adam reads under LambdaLR", xlabel="update n (step_num)", ylabel="lr")
    ax.legend(fontsize=8)
    fig.tight_layout()
    ev.figure(fig, "schedule", "The rate in Adam's parameter group before each update; dots: the closed-form peak "
                               "d_model^−0.5 · warmup^−0.5 at n = warmup.")


# --8<-- [start:test_formula]
@pytest.mark.claim("C-LR-1", "confirmed")
def test_schedule_matches_formula_and_peaks_at_warmup(ev, seed):
    """The rate LambdaLR sets for every update 1..16,000 equals the paper's formula; it peaks at n = warmup with
    d^−0.5·warmup^−0.5; and where Adam really steps (updates 1, 4,000 and 16,000) it moves the parameter by that rate.
    Would be refuted if any rate differed from the formula by more than float rounding (rel 1e-12), if the largest
    rate fell anywhere but n = warmup (an off-by-one in n = step + 1 puts it at 3,999 or 4,001), or if Adam's step
    at one of the checked updates were not the rate read before it."""
    steps, checked = 16_000, (1, PAPER["warmup"], 16_000)
    used, applied = rates_set(noam_schedule(**PAPER), steps, adam_at=checked)
    curves = {(512, 4000): used, (1024, 4000): rates_used(1024, 4000, 6_000)}  # the second past its peak at 4000
    _plot(ev, curves)
    rel = max(abs(u - paper_rate(n, **PAPER)) / paper_rate(n, **PAPER) for n, u in enumerate(used, start=1))
    peak_n = max(range(steps), key=used.__getitem__) + 1
    closed = PAPER["d_model"] ** -0.5 * PAPER["warmup"] ** -0.5
    ev.record("largest relative gap, LambdaLR's rate vs formula (updates 1-16,000)", rel, expect="0 (float rounding)")
    ev.record("Adam's step / the rate read, at updates 1, 4,000 and 16,000", [applied[n] for n in checked],
              expect="1 each (float rounding)")
    ev.record("update with the largest rate (d_model 512, warmup 4000)", peak_n, expect="= warmup = 4000")
    ev.record("largest rate", used[peak_n - 1], expect="d_model^−0.5 · warmup^−0.5")
    ev.record("d_model^−0.5 · warmup^−0.5", closed)
    ev.record("rate at update 1 / rate at the peak", used[0] / used[peak_n - 1], expect="1/warmup = 2.5e-4")
    ev.record("rate at update 16,000 / rate at the peak", used[15_999] / used[peak_n - 1], expect="√(4000/16000) = 0.5")
    for (d, w), r in curves.items():
        n = max(range(len(r)), key=r.__getitem__) + 1
        ev.record(f"peak update and rate, d_model {d}, warmup {w}", [n, r[n - 1]], key=False)
        assert n == w and r[n - 1] == pytest.approx(d**-0.5 * w**-0.5, rel=1e-12)
    assert rel < 1e-12
    assert all(ratio == pytest.approx(1.0, rel=1e-9) for ratio in applied.values())
    assert used[0] / used[peak_n - 1] == pytest.approx(1 / 4000, rel=1e-12)
    assert used[15_999] / used[peak_n - 1] == pytest.approx(0.5, rel=1e-12)
# --8<-- [end:test_formula]


# --8<-- [start:test_off_by_one]
@pytest.mark.claim("C-LR-1", "confirmed")
def test_lambdalr_counts_from_zero(ev, seed):
    """LambdaLR calls the schedule with 0 first: the paper's formula with step_num = 0 divides by zero. The common
    guard (the Annotated Transformer's `if step == 0: step = 1`) builds, but gives updates 1 and 2 the same rate and
    moves the peak to update warmup + 1; n = step + 1 gives update n the paper's rate for step_num = n. Would be
    refuted if LambdaLR first called the schedule with 1 (the formula as written would build, and the guard would
    change nothing), or if noam_schedule(0) were not the rate for step_num = 1."""
    d, w = PAPER["d_model"], PAPER["warmup"]
    naive = lambda step: d**-0.5 * min(step**-0.5, step * w**-1.5)  # noqa: E731 (step_num taken as LambdaLR's step)
    opt = torch.optim.Adam([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    with pytest.raises(ZeroDivisionError):
        torch.optim.lr_scheduler.LambdaLR(opt, naive)
    ev.record("paper formula fed LambdaLR's first step (0)", "ZeroDivisionError", expect="0^−0.5 is undefined")
    guarded, _ = rates_set(lambda step: naive(max(step, 1)), w + 100)  # the guard: step 0 read as step 1
    guarded_peak = max(range(len(guarded)), key=guarded.__getitem__) + 1
    ev.record("guarded formula (step 0 -> 1): rate of update 2 / rate of update 1", guarded[1] / guarded[0],
              expect="1: the first rate twice")
    ev.record("guarded formula: update with the largest rate", guarded_peak, expect="warmup + 1 = 4001")
    shifted = noam_schedule(d, w)
    ev.record("noam_schedule(0) = rate of update 1", shifted(0), expect="d^−0.5 · warmup^−1.5")
    assert shifted(0) == pytest.approx(d**-0.5 * w**-1.5, rel=1e-12)
    assert guarded[1] == guarded[0] and guarded_peak == w + 1
# --8<-- [end:test_off_by_one]
