"""Coding drill: a warmup-stable-decay (WSD) learning-rate multiplier.

Write `wsd_multiplier(step, total, warmup, decay_frac, floor)` (no proofs.schedules), then run
`pytest proofs/drills/drill_wsd_schedule.py`.
"""

PAGE = "training/wsd-vs-cosine.md"


def wsd_multiplier(step: int, total: int, warmup: int, decay_frac: float = 0.2, floor: float = 0.0) -> float:
    """The factor that multiplies the peak learning rate before update number step + 1 (step counts from 0, as
    torch's LambdaLR calls it), for a run of `total` updates:

    - warm-up: update n = step + 1 <= warmup uses n / warmup (so the first update is not at rate 0);
    - stable: 1 until the decay starts, at step total - D with D = round(decay_frac * total);
    - decay: linear from 1 towards floor: floor + (1 - floor) * (1 - p), p = (step - (total - D)) / D.

    Raise ValueError when decay_frac is outside (0, 1], when warmup >= total, or when the decay would start
    inside the warm-up."""
    raise NotImplementedError("write the WSD multiplier here")


# ---- the checks (leave them as they are) ------------------------------------------------------------
import pytest  # noqa: E402
import torch  # noqa: E402

from proofs.drills import pick  # noqa: E402
from proofs.schedules import wsd  # noqa: E402


def reference(step, total, warmup, decay_frac=0.2, floor=0.0):
    return wsd(total, warmup, decay_frac, "linear", floor)(step)  # the shared module's own


SETTINGS = [(100, 10, 0.2, 0.0), (160, 10, 0.2, 0.0), (1000, 50, 0.1, 0.1), (37, 0, 0.5, 0.0), (10, 2, 1 / 8, 0.05)]


@pytest.mark.parametrize("total, warmup, frac, floor", SETTINGS)
def test_matches_the_shared_module(total, warmup, frac, floor):
    f = pick(wsd_multiplier, reference)
    for step in range(total):
        assert f(step, total, warmup, frac, floor) == pytest.approx(reference(step, total, warmup, frac, floor),
                                                                    abs=1e-12), f"step {step}"


def test_the_three_phases():
    f = pick(wsd_multiplier, reference)
    assert f(0, 100, 10) == pytest.approx(0.1), "the first update uses 1/warmup of the peak, not 0"
    assert f(9, 100, 10) == pytest.approx(1.0), "the warm-up ends at the peak"
    assert all(f(s, 100, 10) == 1.0 for s in range(10, 80)), "the stable phase holds the peak exactly"
    assert f(80, 100, 10) == pytest.approx(1.0) and f(90, 100, 10) == pytest.approx(0.5)
    decay = [f(s, 100, 10) for s in range(80, 100)]
    assert all(a > b for a, b in zip(decay, decay[1:])), "the decay falls at every step"
    assert f(99, 100, 10, 0.2, 0.1) == pytest.approx(0.1 + 0.9 / 20), "linear towards the floor, not to 0"


def test_the_stable_prefix_does_not_depend_on_the_budget():
    f = pick(wsd_multiplier, reference)
    short, long = [f(s, 50, 10) for s in range(40)], [f(s, 400, 10) for s in range(40)]
    assert short == long, "before its decay a WSD run of 50 updates must equal one of 400: that is what branching needs"


def test_drives_an_optimizer_through_lambdalr():
    f = pick(wsd_multiplier, reference)
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.5)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: f(s, 20, 4, 0.25))
    rates = []
    for _ in range(20):
        rates.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert rates[0] == pytest.approx(0.5 / 4) and rates[3] == rates[14] == pytest.approx(0.5)
    assert rates[15] == pytest.approx(0.5) and rates[19] == pytest.approx(0.5 / 5)


@pytest.mark.parametrize("args", [(0, 100, 10, 0.0), (0, 100, 10, 1.5), (0, 100, 100, 0.2), (0, 100, 50, 0.6)])
def test_bad_settings_raise(args):
    f = pick(wsd_multiplier, reference)
    with pytest.raises(ValueError):
        f(*args)
