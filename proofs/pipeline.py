"""Pipeline-parallel schedules: a unit-time simulator and a micro-batched runner over real gloo processes.

The simulator (`simulate`) takes, for each of p devices, the ORDER in which that device runs its forward (F) and
backward (B) passes, and times them as soon as possible: an op starts when its device is free and the ops it
depends on are done. Its assumptions, all of them:

* every stage (every model chunk) costs the same: F = `f` time units, B = `b` units (default F = 1, B = 2);
* sending an activation or a gradient to the next device takes no time (communication is free and overlapped);
* a device runs one op at a time, in the order given, never pre-empted; no optimizer step is timed (the flush:
  the step ends when the last backward ends).

Dependencies: F of micro-batch j on virtual stage k needs F of j on k-1; B of j on k needs B of j on k+1 (and
its own F; the last virtual stage's B needs only that). With v chunks per device, virtual stage k = c·p + d
lives on device d as chunk c (Megatron's interleaved assignment, Narayanan et al. 2021, §2.2.2).

Orders (`gpipe_order`, `one_f_one_b_order`, `interleaved_order`):

* GPipe (Huang et al. 2019): all m forwards, then all m backwards (last micro-batch first).
* 1F1B, PipeDream-Flush (Narayanan et al. 2021, §2.2.1): device d runs min(p-d-1, m) warm-up forwards, then
  alternates one forward and one backward, then drains the remaining backwards.
* Interleaved 1F1B (§2.2.2), the order of Megatron-LM's `forward_backward_pipelining_with_interleaving` as written
  before its Nov 2024 rework (commit 4295be1a6c): forwards go through micro-batches in groups of p, chunk 0 first;
  backwards likewise with the chunks reversed; device d warms up with (p-d-1)·2 + (v-1)·p forwards (all m·v when
  m = p). It needs m to be a multiple of p. (Since that rework the group size is tunable, p..m, default p, and m
  mod group may be 0 or >= p; the m = p branch is gone. With the default group the order below is unchanged
  except at m = p, where the bubble and device 0's peak come out the same.)

`Schedule` holds the per-device timelines (one label per time unit, None when idle), idle units, and the peak
number of micro-batches whose activations a device holds (F done, B not yet), per device.

The runner (`run_stage`) executes one of these orders for real: each rank of a torch.distributed group is one
stage (a `torch.nn.Module`), activations go forward and gradients backward by point-to-point messages, and a
saved-tensor hook counts the bytes autograd keeps for backward, per micro-batch, so the live total at any
moment is the sum over micro-batches whose forward ran and whose backward has not.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction
from typing import Callable, Optional

import torch
import torch.distributed as dist
from torch import Tensor

from proofs.transformer.config import ConfigError


@dataclass(frozen=True)
class Op:
    kind: str   # "F" or "B"
    mb: int     # micro-batch index, 0..m-1
    chunk: int = 0  # model chunk on this device, 0..v-1 (always 0 without interleaving)

    def label(self, v: int = 1) -> str:
        return f"{self.kind}{self.mb}" + (f".{self.chunk}" if v > 1 else "")


def _check(p: int, m: int, v: int = 1) -> None:
    if p < 1 or m < 1 or v < 1:
        raise ConfigError(f"p={p}, m={m}, v={v}: a pipeline needs at least one stage, one micro-batch and one chunk "
                          f"per device; pass positive integers.")


# --8<-- [start:orders]
def gpipe_order(p: int, m: int) -> list[list[Op]]:
    """Every device: F0 .. F(m-1), then B(m-1) .. B0 (all forwards, then all backwards)."""
    _check(p, m)
    return [[Op("F", j) for j in range(m)] + [Op("B", j) for j in reversed(range(m))] for _ in range(p)]


def one_f_one_b_order(p: int, m: int) -> list[list[Op]]:
    """PipeDream-Flush: device d warms up with min(p-d-1, m) forwards, then one F / one B, then the drain."""
    _check(p, m)
    orders = []
    for d in range(p):
        warm = min(p - d - 1, m)
        ops = [Op("F", j) for j in range(warm)]
        for j in range(m - warm):            # steady state: F of micro-batch warm+j, then B of micro-batch j
            ops += [Op("F", warm + j), Op("B", j)]
        ops += [Op("B", j) for j in range(m - warm, m)]  # drain
        orders.append(ops)
    return orders


def interleaved_order(p: int, m: int, v: int) -> list[list[Op]]:
    """Megatron-LM's interleaved 1F1B with v chunks per device, groups of p micro-batches (m a multiple of p)."""
    _check(p, m, v)
    if m % p:
        raise ConfigError(f"interleaved schedule with m={m} micro-batches on p={p} devices: m must be a multiple "
                          f"of p (as in Megatron-LM with its default grouping of p micro-batches); use "
                          f"m={-(-m // p) * p} or the plain 1F1B order.")
    total = m * v

    def nth(k: int, forward: bool) -> Op:  # the k-th forward (or backward) op of a device
        group, in_group = divmod(k, p * v)
        chunk = in_group // p
        return Op("F" if forward else "B", group * p + in_group % p, chunk if forward else v - 1 - chunk)

    orders = []
    for d in range(p):
        warm = total if m == p else min((p - d - 1) * 2 + (v - 1) * p, total)
        ops = [nth(k, True) for k in range(warm)]
        for k in range(total - warm):
            ops += [nth(warm + k, True), nth(k, False)]
        ops += [nth(k, False) for k in range(total - warm, total)]
        orders.append(ops)
    return orders
# --8<-- [end:orders]


@dataclass
class Schedule:
    p: int
    m: int
    v: int
    f: int
    b: int
    start: list[dict[Op, int]]               # per device: op -> start time
    timelines: list[list[Optional[str]]]     # per device: one label per time unit (None = idle), length makespan
    peak_in_flight: list[int]                # per device: most (micro-batch, chunk) activations held at once
    makespan: int = 0
    busy: list[int] = field(default_factory=list)

    @property
    def idle(self) -> list[int]:
        return [self.makespan - b for b in self.busy]

    def idle_fraction(self) -> Fraction:
        """Idle device-time / total device-time of the step (the bubble as a share of the step)."""
        return Fraction(sum(self.idle), self.p * self.makespan)

    def idle_over_useful(self) -> Fraction:
        """Idle device-time / busy device-time (the bubble relative to the ideal, useful time)."""
        return Fraction(sum(self.idle), sum(self.busy))


# --8<-- [start:simulate]
def simulate(orders: list[list[Op]], v: int = 1, f: int = 1, b: int = 2) -> Schedule:
    """Time each device's op list as soon as possible (see the module docstring for the assumptions)."""
    p = len(orders)
    m = 1 + max(op.mb for ops in orders for op in ops)
    stages = p * v                                            # virtual stages; k = chunk·p + device
    done: dict[tuple[str, int, int], int] = {}                # (kind, mb, virtual stage) -> finish time
    start: list[dict[Op, int]] = [{} for _ in range(p)]
    free, nxt = [0] * p, [0] * p

    def deps(op: Op, d: int) -> list[tuple[str, int, int]]:
        k = op.chunk * p + d
        if op.kind == "F":
            return [("F", op.mb, k - 1)] if k > 0 else []
        return [("F", op.mb, k)] + ([("B", op.mb, k + 1)] if k < stages - 1 else [])

    while any(nxt[d] < len(orders[d]) for d in range(p)):
        progressed = False
        for d in range(p):
            while nxt[d] < len(orders[d]):
                op = orders[d][nxt[d]]
                need = deps(op, d)
                if any(x not in done for x in need):
                    break                                   # wait for another device
                t0 = max([free[d]] + [done[x] for x in need])
                free[d] = t0 + (f if op.kind == "F" else b)
                done[(op.kind, op.mb, op.chunk * p + d)] = free[d]
                start[d][op] = t0
                nxt[d] += 1
                progressed = True
        if not progressed:
            raise ConfigError("the op orders deadlock: some device waits for an op that can never run. "
                              "Check that each device's list respects the forward/backward dependencies.")
    makespan = max(free)
    timelines, peaks, busy = [], [], []
    for d in range(p):
        row: list[Optional[str]] = [None] * makespan
        events = []                                          # (time, +1 at F's start, -1 at B's end)
        for op, t0 in start[d].items():
            dur = f if op.kind == "F" else b
            row[t0:t0 + dur] = [op.label(v)] * dur
            events.append((t0, 1) if op.kind == "F" else (t0 + dur, -1))
        held = peak = 0
        for _, delta in sorted(events, key=lambda e: (e[0], e[1])):  # at equal times release before acquiring
            held += delta
            peak = max(peak, held)
        timelines.append(row)
        peaks.append(peak)
        busy.append(sum(x is not None for x in row))
    return Schedule(p, m, v, f, b, start, timelines, peaks, makespan, busy)
# --8<-- [end:simulate]


# --8<-- [start:formulas]
def gpipe_bubble(p: int, m: int) -> Fraction:
    """Huang et al. 2019, §2.3: the bubble's share of the step, (p-1)/(m+p-1)."""
    return Fraction(p - 1, m + p - 1)


def megatron_bubble(p: int, m: int, v: int = 1) -> Fraction:
    """Narayanan et al. 2021, §2.2.1-2.2.2: bubble time / ideal time, (p-1)/m, divided by v when interleaved."""
    return Fraction(p - 1, m * v)
# --8<-- [end:formulas]


def render(s: Schedule, width: int = 3) -> str:
    """The timelines as text, one row per device, '.' for an idle unit."""
    return "\n".join(f"dev {d}: " + "".join((x or ".").ljust(width) for x in row).rstrip()
                     for d, row in enumerate(s.timelines))


# --8<-- [start:runner]
class SavedBytes:
    """A saved-tensor hook that charges the bytes autograd keeps for backward to the current micro-batch.

    Tensors sharing storage with a parameter (a weight saved for its gradient, or a view of it) are not charged:
    they are not activations and exist once whatever the schedule. A micro-batch's bytes are released when its
    backward has run (autograd frees its graph then)."""

    def __init__(self, params: list[Tensor]):
        self.param_ptrs = {q.untyped_storage().data_ptr() for q in params}
        self.per_mb: dict[int, int] = {}
        self.live = self.peak = 0
        self.mb = -1

    def pack(self, t: Tensor) -> Tensor:
        if t.untyped_storage().data_ptr() not in self.param_ptrs:
            n = t.numel() * t.element_size()
            self.per_mb[self.mb] = self.per_mb.get(self.mb, 0) + n
            self.live += n
            self.peak = max(self.peak, self.live)
        return t

    def release(self, mb: int) -> None:
        self.live -= self.per_mb.get(mb, 0)


def run_stage(stage: torch.nn.Module, order: list[Op], rank: int, world: int, inputs: list[Tensor],
              loss_fn: Callable[[Tensor, int], Tensor], act_shape: tuple[int, ...],
              dtype: torch.dtype = torch.float64) -> dict:
    """Run this rank's op order (one chunk per device) for real: rank r is stage r of `world`.

    inputs: per micro-batch, the first stage's input (rank 0 only reads it). loss_fn(output, mb): the last stage's
    scalar loss for micro-batch mb, already scaled so that the sum over micro-batches is the full-batch loss.
    act_shape: the shape of one micro-batch's activation between stages. Sends are non-blocking (isend) so that
    two neighbours sending to each other at once cannot deadlock. Returns this stage's accumulated parameter
    gradients, the saved-tensor bytes (peak and per micro-batch) and the order actually run."""
    params = list(stage.parameters())
    hook = SavedBytes(params)
    first, last = rank == 0, rank == world - 1
    held: dict[int, tuple[Tensor, Optional[Tensor]]] = {}   # mb -> (output or loss, input that needs a grad)
    pending, ran, loss_total = [], [], 0.0
    for op in order:
        hook.mb = op.mb
        if op.kind == "F":
            x = inputs[op.mb]
            if not first:
                x = torch.empty(act_shape, dtype=dtype)
                dist.recv(x, rank - 1)
                x.requires_grad_(True)
            with torch.autograd.graph.saved_tensors_hooks(hook.pack, lambda t: t):
                y = stage(x)
                if last:
                    y = loss_fn(y, op.mb)
            if last:
                loss_total += y.item()
            else:
                out = y.detach().contiguous()
                pending.append((dist.isend(out, rank + 1), out))
            held[op.mb] = (y, x if not first else None)
        else:
            y, x = held.pop(op.mb)
            if last:
                y.backward()
            else:
                g = torch.empty(act_shape, dtype=dtype)
                dist.recv(g, rank + 1)
                y.backward(g)
            hook.release(op.mb)
            if not first:
                gx = x.grad.contiguous()
                pending.append((dist.isend(gx, rank - 1), gx))
        ran.append(op.label())
    for req, _ in pending:
        req.wait()
    return {"grads": [q.grad.detach().clone() for q in params], "peak_saved_bytes": hook.peak,
            "saved_bytes_per_mb": dict(hook.per_mb), "live_at_end": hook.live, "ran": ran, "loss": loss_total}
# --8<-- [end:runner]
