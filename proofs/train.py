"""A tiny deterministic training loop: the same for every proof that trains."""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from proofs.optim import FlatAdam


@dataclass
class TrainLog:
    loss: list[float] = field(default_factory=list)  # training loss per step
    grad_norm: list[float] = field(default_factory=list)  # global gradient norm per step (before clipping)

    @property
    def diverged(self) -> bool:
        return any(not math.isfinite(v) for v in self.loss)

    def final(self, last: int = 10) -> float:
        tail = self.loss[-last:]
        return sum(tail) / len(tail)


def token_loss(logits: Tensor, target: Tensor, label_smoothing: float = 0.0) -> Tensor:
    """Mean cross-entropy over all positions: logits (B, T, V), target (B, T)."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1), label_smoothing=label_smoothing)


def grad_norm(params: list[Tensor]) -> Tensor:
    """What clip_grad_norm_(params, inf) returns and does, without its multiply by min(1, inf / norm) when that factor
    is exactly 1: the global norm computed as torch computes it (per-tensor norms, then the norm of those). When the
    norm is inf or nan the factor is nan and torch's call runs, so the gradients turn nan as they always did."""
    grads = [p.grad for p in params if p.grad is not None]
    if len({(g.dtype, g.device, type(g)) for g in grads}) != 1:  # none, or several kinds: torch's own grouping
        return torch.nn.utils.clip_grad_norm_(params, float("inf"))
    norm = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads, 2.0)), 2.0)
    return norm if math.isfinite(norm.item()) else torch.nn.utils.clip_grad_norm_(params, float("inf"))


# --8<-- [start:noam]
def noam_schedule(d_model: int, warmup: int) -> Callable[[int], float]:
    """Vaswani et al. (2017) §5.3 as a LambdaLR multiplier of lr=1: d_model^-0.5 · min(n^-0.5, n · warmup^-1.5).

    LambdaLR counts steps from 0; the paper's step_num n counts from 1, so n = step + 1.
    """

    def lr_at(step: int) -> float:
        n = step + 1
        return d_model**-0.5 * min(n**-0.5, n * warmup**-1.5)

    return lr_at
# --8<-- [end:noam]


def train(
    model: nn.Module,
    batches: Callable[[int], tuple[Tensor, Tensor]],
    steps: int,
    lr: float = 1e-3,
    schedule: Callable[[int], float] | None = None,
    betas: tuple[float, float] = (0.9, 0.98),
    clip: float | None = None,
    label_smoothing: float = 0.0,
    extra_loss: Callable[[nn.Module], Tensor] | None = None,
    z_loss: float = 0.0,
) -> TrainLog:
    """Adam on token cross-entropy. batches(step) -> (inputs, targets); schedule(step) multiplies lr.

    extra_loss(model), if given, is added to the loss that is minimised (e.g. a mixture of experts'
    load-balancing loss, read after the forward pass); log.loss keeps the token cross-entropy alone.
    z_loss > 0 adds z_loss · mean(logsumexp(logits)²) to the minimised loss (PaLM's auxiliary loss that pulls
    log Z towards 0); log.loss still records the cross-entropy alone.
    Stops early (and records inf) once the loss stops being finite.
    """
    params = [p for p in model.parameters()]  # listed once: walking the module tree every step costs ~5% on tiny models
    # FlatAdam: torch's foreach Adam on one buffer that holds every parameter, bit-identical weights (checked in
    # tests/test_train.py) with eight kernel calls a step instead of eight per parameter tensor
    if FlatAdam.supports(params):
        opt = FlatAdam(params, lr=lr, betas=betas, eps=1e-9)
    else:
        opt = torch.optim.Adam(params, lr=lr, betas=betas, eps=1e-9, foreach=True)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, schedule) if schedule else None
    log = TrainLog()
    model.train()
    for step in range(steps):
        x, y = batches(step)
        logits = model(x)
        loss = token_loss(logits, y, label_smoothing)
        opt.zero_grad(set_to_none=True)
        total = loss + extra_loss(model) if extra_loss else loss
        if z_loss:
            log_z = logits.to(torch.promote_types(logits.dtype, torch.float32)).logsumexp(-1)  # never below fp32
            total = total + z_loss * log_z.pow(2).mean()
        total.backward()
        gn = torch.nn.utils.clip_grad_norm_(params, clip) if clip else grad_norm(params)
        log.loss.append(loss.item())
        log.grad_norm.append(gn.item())
        if not math.isfinite(loss.item()):
            break
        opt.step()
        if sched:
            sched.step()
    model.eval()
    return log


@torch.no_grad()
def accuracy(model: nn.Module, x: Tensor, y: Tensor) -> float:
    """Fraction of target tokens predicted exactly (eval mode)."""
    model.eval()
    return (model(x).argmax(-1) == y).float().mean().item()


_DRAWN: dict[tuple, tuple[torch.Generator, list]] = {}  # (task, seed, batch, length, vocab) -> (its generator, draws)
_DRAWN_KEEP = 64  # the most recent streams kept: the arms of one seed follow one another


def fixed_batches(task, seed: int, batch: int, length: int, vocab: int,
                  shared: bool = True) -> Callable[[int], tuple[Tensor, Tensor]]:
    """A fresh seeded batch per step: both arms of an ablation see exactly the same data.

    Step k's batch is the k-th draw of task(g, batch, length, vocab) from a generator seeded with `seed`; `task` must
    depend on nothing else (every task in proofs/ is such a function). The draws are kept per (task, seed, batch,
    length, vocab) and shared by every call with those arguments (each arm used to draw them again; some tasks are
    Python loops), and each read is a deep copy, so no arm sees another's edits. shared=False draws afresh (a timing
    benchmark that must include the drawing).
    """
    key = (task, seed, batch, length, vocab)
    if not shared or key not in _DRAWN:
        stream = (torch.Generator().manual_seed(seed), [])
        if not shared:
            return _reader(task, stream, batch, length, vocab)
        _DRAWN[key] = stream
        while len(_DRAWN) > _DRAWN_KEEP:
            _DRAWN.pop(next(iter(_DRAWN)))
    return _reader(task, _DRAWN[key], batch, length, vocab)


def _reader(task, stream: tuple[torch.Generator, list], batch: int, length: int, vocab: int):
    g, drawn = stream

    def get(step: int):
        while len(drawn) <= step:
            drawn.append(task(g, batch, length, vocab))
        return copy.deepcopy(drawn[step])

    return get
