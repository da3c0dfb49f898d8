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
# Adam's step reads its rate from there. Update number n (counting from 1, as the
# paper's step_num does) uses the rate read before it.

# %%
# --8<-- [start:driven]
def rates_used(d_model: int, warmup: int, steps: int) -> list[float]:
    """The learning rate Adam applies at updates 1..steps under LambdaLR(noam_schedule): the rate LambdaLR has
    written into Adam's param group when each update runs (Adam.step reads it from there). Adam steps once, before
    the scheduler's first step as LambdaLR expects; the rates that follow do not depend on the updates (a closed form
    of the step count), so the other 15,999 updates, 99 % of this test's time, are left out."""
    w = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.Adam([w], lr=1.0, betas=(0.9, 0.98), eps=1e-9)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, noam_schedule(d_model, warmup))
    used = []
    for n in range(steps):
        used.append(opt.param_groups[0]["lr"])
        if n == 0:
            w.grad = torch.ones_like(w)
            opt.step()
        sched.step()
    return used


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
    ax.set(title="learning rate used by Adam under LambdaLR", xlabel="update n (step_num)", ylabel="lr")
    ax.legend(fontsize=8)
    fig.tight_layout()
    ev.figure(fig, "schedule", "The schedule as the optimizer saw it; dots: the closed-form peak "
                               "d_model^−0.5 · warmup^−0.5 at n = warmup.")


# --8<-- [start:test_formula]
@pytest.mark.claim("C-LR-1", "confirmed")
def test_schedule_matches_formula_and_peaks_at_warmup(ev, seed):
    """The rate Adam uses equals the paper's formula at every step; it peaks at n = warmup with d^−0.5·warmup^−0.5."""
    steps = 16_000
    curves = {(512, 4000): rates_used(512, 4000, steps), (1024, 4000): rates_used(1024, 4000, 6_000)}  # past its peak at 4000
    _plot(ev, curves)
    used = curves[PAPER["d_model"], PAPER["warmup"]]
    rel = max(abs(u - paper_rate(n, **PAPER)) / paper_rate(n, **PAPER) for n, u in enumerate(used, start=1))
    peak_n = max(range(steps), key=used.__getitem__) + 1
    closed = PAPER["d_model"] ** -0.5 * PAPER["warmup"] ** -0.5
    ev.record("largest relative gap, LambdaLR-driven Adam vs formula (16,000 updates)", rel, expect="0 (float rounding)")
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
    assert used[0] / used[peak_n - 1] == pytest.approx(1 / 4000, rel=1e-12)
    assert used[15_999] / used[peak_n - 1] == pytest.approx(0.5, rel=1e-12)
# --8<-- [end:test_formula]


# --8<-- [start:test_off_by_one]
@pytest.mark.claim("C-LR-1", "confirmed")
def test_lambdalr_counts_from_zero(ev, seed):
    """LambdaLR calls the schedule with 0 first: the paper's formula with step_num = 0 divides by zero."""
    d, w = PAPER["d_model"], PAPER["warmup"]
    naive = lambda step: d**-0.5 * min(step**-0.5, step * w**-1.5)  # noqa: E731 (step_num taken as LambdaLR's step)
    opt = torch.optim.Adam([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    with pytest.raises(ZeroDivisionError):
        torch.optim.lr_scheduler.LambdaLR(opt, naive)
    ev.record("paper formula fed LambdaLR's first step (0)", "ZeroDivisionError", expect="0^−0.5 is undefined")
    shifted = noam_schedule(d, w)
    ev.record("noam_schedule(0) = rate of update 1", shifted(0), expect="d^−0.5 · warmup^−1.5")
    assert shifted(0) == pytest.approx(d**-0.5 * w**-1.5, rel=1e-12)
# --8<-- [end:test_off_by_one]
