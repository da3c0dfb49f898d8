"""Learning-rate schedules as `schedule(step) -> multiplier` callables for `proofs.train.train`.

The trainer hands each one to `torch.optim.lr_scheduler.LambdaLR`, which calls it with the number of updates
done so far (0 for the first update) and multiplies the peak rate `lr` by what it returns. Every schedule here
peaks at 1, so arms that share `lr` share their peak:

- `cosine(total, warmup, floor)`: linear warm-up, then half a cosine from 1 down to `floor` at `total`;
- `wsd(total, warmup, decay_frac, shape, floor)`: warm-up, a constant (stable) phase, and a decay over the last
  `decay_frac` of the steps (Hu et al. 2024, MiniCPM §4: warmup-stable-decay);
- `inverse_sqrt(warmup)`: the Transformer's schedule (Vaswani et al. 2017 §5.3; see proofs.train.noam_schedule)
  rescaled to peak at 1: linear warm-up, then sqrt(warmup / n). It needs no total.

The schedules live here, not in proofs/train.py: every proof's evidence and seed record is fingerprinted on
train.py, so adding to it would mark them all stale. Bad settings raise ConfigError with the fix.
"""

from __future__ import annotations

import math
from typing import Callable

from proofs.transformer.config import ConfigError

Schedule = Callable[[int], float]
DECAY_SHAPES = ("linear", "cosine", "1-sqrt")


def _check(total: int | None, warmup: int, floor: float) -> None:
    if total is not None and (not isinstance(total, int) or total < 1):
        raise ConfigError(f"total={total!r}: the number of updates must be a positive integer.")
    if not isinstance(warmup, int) or warmup < 0:
        raise ConfigError(f"warmup={warmup!r}: the warm-up length must be an integer >= 0 (0 = no warm-up).")
    if total is not None and warmup >= total:
        raise ConfigError(f"warmup={warmup} >= total={total}: the warm-up would use the whole run. "
                          f"Pick warmup < total (a few percent of it is usual).")
    if not 0.0 <= floor < 1.0:
        raise ConfigError(f"floor={floor!r}: the final multiplier must be in [0, 1) (0.1 = decay to 10 % of the peak).")


def _warm(step: int, warmup: int) -> float:
    """Linear warm-up: update n = step + 1 uses n / warmup of the peak, reaching 1 at n = warmup."""
    return min(1.0, (step + 1) / warmup) if warmup else 1.0


# --8<-- [start:cosine]
def cosine(total: int, warmup: int = 0, floor: float = 0.1) -> Schedule:
    """Linear warm-up over `warmup` updates, then floor + (1 - floor) · ½(1 + cos(π p)), with p = the fraction of
    the post-warm-up updates already done (0 at the first, (total-warmup-1)/(total-warmup) at the last)."""
    _check(total, warmup, floor)

    def at(step: int) -> float:
        if step < warmup:
            return _warm(step, warmup)
        p = min(1.0, (step - warmup) / (total - warmup))
        return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * p))

    return at
# --8<-- [end:cosine]


# --8<-- [start:wsd]
def wsd(total: int, warmup: int = 0, decay_frac: float = 0.2, shape: str = "linear", floor: float = 0.0) -> Schedule:
    """Warmup-stable-decay: linear warm-up, the peak (1) held, then over the last D = round(decay_frac · total)
    updates a decay from 1 towards `floor`: with p = (step - (total - D)) / D in [0, 1),
    linear 1 - p, cosine ½(1 + cos(π p)), 1-sqrt 1 - √p (Hägele et al. 2024), scaled to [floor, 1].
    Up to step total - D the schedule does not depend on total: that is what lets one run serve many budgets."""
    _check(total, warmup, floor)
    if not 0.0 < decay_frac <= 1.0:
        raise ConfigError(f"decay_frac={decay_frac!r}: the decay is a fraction of the run in (0, 1] "
                          f"(0.1-0.2 is usual; 1 = decay from the end of warm-up).")
    if shape not in DECAY_SHAPES:
        raise ConfigError(f"shape={shape!r}: pick one of {DECAY_SHAPES}.")
    decay = max(1, round(decay_frac * total))
    start = total - decay  # first decaying update
    if start < warmup:
        raise ConfigError(f"the decay ({decay} updates) would start at update {start}, inside the warm-up "
                          f"({warmup}): lower decay_frac below {(total - warmup) / total:.3g} or shorten warmup.")
    f = {"linear": lambda p: 1 - p, "cosine": lambda p: 0.5 * (1 + math.cos(math.pi * p)),
         "1-sqrt": lambda p: 1 - math.sqrt(p)}[shape]

    def at(step: int) -> float:
        if step < warmup:
            return _warm(step, warmup)
        if step < start:
            return 1.0
        return floor + (1 - floor) * f(min(1.0, (step - start) / decay))

    at.decay_start = start  # the last stable checkpoint, where a decay branches off
    return at
# --8<-- [end:wsd]


# --8<-- [start:inverse_sqrt]
def inverse_sqrt(warmup: int) -> Schedule:
    """Vaswani et al.'s min(n^-0.5, n · warmup^-1.5), n = step + 1, times sqrt(warmup): linear warm-up to 1 at
    n = warmup, then sqrt(warmup / n). It equals proofs.train.noam_schedule(d, warmup) · sqrt(d · warmup)."""
    if not isinstance(warmup, int) or warmup < 1:
        raise ConfigError(f"warmup={warmup!r}: inverse-sqrt divides by the warm-up length; pick warmup >= 1.")

    def at(step: int) -> float:
        n = step + 1
        return math.sqrt(warmup) * min(n**-0.5, n * warmup**-1.5)

    return at
# --8<-- [end:inverse_sqrt]
