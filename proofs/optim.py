"""Adam on one flat buffer: the shared training loop's optimiser, torch's Adam arithmetic with fewer kernel calls.

The proofs' models are tiny, so an Adam step is dominated by the number of tensors it touches, not by their size:
torch's foreach Adam on CPU runs each of its eight operations once per parameter tensor. `FlatAdam` lays every
trainable parameter, and both moments, out end to end in one buffer (each parameter becomes a view of its slice), so
a step is those eight operations once. Every operation is elementwise with the same scalars, so the weights come out
bit for bit those of `torch.optim.Adam(foreach=True)` (tests/test_train.py holds the two equal, step by step, on
models with and without frozen weights, schedules, clipping and steps where some parameters get no gradient).

A step where some parameter has no gradient (an expert no token was routed to) takes torch's per-tensor path on the
parameters that have one, as torch does: each keeps its own step count for the bias corrections.
"""

from __future__ import annotations

import torch
from torch import Tensor


def _span(p: Tensor) -> tuple[int, int]:
    """The bytes a tensor's elements occupy: exact when contiguous, else (conservatively) its whole storage."""
    if p.is_contiguous():
        return p.data_ptr(), p.data_ptr() + p.numel() * p.element_size()
    storage = p.untyped_storage()
    return storage.data_ptr(), storage.data_ptr() + storage.nbytes()


class FlatAdam(torch.optim.Optimizer):
    """Adam (no weight decay, amsgrad or maximize) over `params`. The trainable ones must be real dense tensors of one
    dtype on one device that share no storage (see `supports`). Parameters that do not require a gradient stay in the
    parameter group, as in torch, and are never updated.

    `state` and `state_dict()` look like torch's Adam (per parameter: step, exp_avg, exp_avg_sq, made at its first
    update), and `load_state_dict` puts a saved state (of either optimizer) into the flat buffers. What the layout
    cannot follow is refused with an error, never run differently: a second parameter group, a frozen parameter
    that gets a gradient later, a parameter whose `.data` was replaced after construction, weight decay, amsgrad or
    maximize switched on in the group."""

    @staticmethod
    def supports(params) -> bool:
        """True when the flat layout applies: real, dense, one dtype and device, no two parameters overlapping in memory
        (parameters already laid out by an earlier FlatAdam, a second training run, are fine: they are disjoint)."""
        trainable = [p for p in {id(p): p for p in params}.values() if p.requires_grad]
        if not trainable or any(p.layout != torch.strided or p.is_complex() for p in trainable):
            return False
        if len({(p.dtype, p.device) for p in trainable}) != 1:
            return False
        spans = sorted(_span(p) for p in trainable)
        return all(end <= start for (_, end), (start, _) in zip(spans, spans[1:]))

    def __init__(self, params, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8):
        params = list({id(p): p for p in params}.values())
        if not self.supports(params):
            raise ValueError("FlatAdam needs trainable parameters that are real, dense, of one dtype and device, and "
                             "share no storage; use torch.optim.Adam for these (FlatAdam.supports tells which)")
        # torch Adam's own defaults (weight_decay 0, no amsgrad ...), so that a state_dict loads into either optimiser
        defaults = torch.optim.Adam([torch.zeros(1, requires_grad=True)], lr=lr, betas=betas, eps=eps,
                                    foreach=True).defaults
        super().__init__(params, defaults)
        trainable = [p for p in params if p.requires_grad]
        self._params, self._frozen = trainable, [p for p in params if not p.requires_grad]
        sizes = [p.numel() for p in trainable]
        self._flat = torch.cat([p.detach().reshape(-1) for p in trainable])  # (N,): every parameter, end to end
        for p, part in zip(trainable, self._flat.split(sizes)):
            p.data = part.view(p.shape)  # the parameter now lives in its slice of the buffer
        self._where = [p.data_ptr() for p in trainable]  # to notice a parameter moved out of the buffer
        self._exp_avg, self._exp_avg_sq = torch.zeros_like(self._flat), torch.zeros_like(self._flat)  # (N,) each
        self._exp_avgs = [m.view(p.shape) for m, p in zip(self._exp_avg.split(sizes), trainable)]
        self._exp_avg_sqs = [v.view(p.shape) for v, p in zip(self._exp_avg_sq.split(sizes), trainable)]
        self._steps = [0] * len(trainable)  # updates done, per parameter (torch keeps one count per parameter too)

    def add_param_group(self, param_group: dict) -> None:
        if self.param_groups:  # the first group comes from __init__; the buffer is laid out once
            raise ValueError("FlatAdam lays its parameters out once: build it with all of them, or use torch.optim.Adam")
        super().add_param_group(param_group)

    def _check(self, group: dict) -> None:
        """Refuse what the flat layout would silently get wrong."""
        if group["weight_decay"] or group["amsgrad"] or group["maximize"]:
            raise ValueError("FlatAdam runs plain Adam; weight_decay, amsgrad or maximize was set: use torch.optim.Adam")
        if any(p.grad is not None for p in self._frozen):
            raise ValueError("a parameter that was frozen when FlatAdam was built has a gradient; FlatAdam never "
                             "updates it: build the optimiser after unfreezing, or use torch.optim.Adam")
        if [p.data_ptr() for p in self._params] != self._where:
            raise ValueError("a parameter's .data was replaced after FlatAdam was built, so its update would be lost: "
                             "build the optimiser after changing the parameters")

    @torch.no_grad()
    def step(self, closure=None):
        if closure is not None:
            raise ValueError("FlatAdam.step takes no closure")
        group = self.param_groups[0]
        self._check(group)
        lr, (beta1, beta2), eps = group["lr"], group["betas"], group["eps"]
        have = [i for i, p in enumerate(self._params) if p.grad is not None]
        for i in have:
            if self._steps[i] == 0:
                self._new_state(i)
            self._steps[i] += 1
        if have:
            torch._foreach_add_([self.state[self._params[i]]["step"] for i in have], 1.0)  # torch's step tensors, kept true
        if len(have) == len(self._params) and len(set(self._steps)) == 1:  # the usual step: one update of the buffer
            grad = torch.cat([p.grad.reshape(-1) for p in self._params])  # (N,), the buffer's layout
            self._update([self._flat], [grad], [self._exp_avg], [self._exp_avg_sq], self._steps[:1], lr, beta1,
                         beta2, eps)
        elif have:  # some parameter got no gradient: only the others move, each with its own step count
            self._update([self._params[i] for i in have], [self._params[i].grad for i in have],
                         [self._exp_avgs[i] for i in have], [self._exp_avg_sqs[i] for i in have],
                         [self._steps[i] for i in have], lr, beta1, beta2, eps)

    @staticmethod
    def _update(params, grads, exp_avgs, exp_avg_sqs, steps, lr, beta1, beta2, eps) -> None:
        """torch's _multi_tensor_adam (not capturable, no weight decay, no amsgrad), operation for operation."""
        torch._foreach_lerp_(exp_avgs, grads, 1 - beta1)
        torch._foreach_mul_(exp_avg_sqs, beta2)
        torch._foreach_addcmul_(exp_avg_sqs, grads, grads, 1 - beta2)
        bias_correction1 = [1 - beta1 ** float(n) for n in steps]  # torch reads its float step tensors as floats
        bias_correction2 = [1 - beta2 ** float(n) for n in steps]
        step_size = [(lr / bc) * -1 for bc in bias_correction1]
        denom = torch._foreach_sqrt(exp_avg_sqs)
        torch._foreach_div_(denom, [bc**0.5 for bc in bias_correction2])
        torch._foreach_add_(denom, eps)
        torch._foreach_addcdiv_(params, exp_avgs, denom, step_size)

    # -- torch's view of the state --------------------------------------------------------------------------------
    def _new_state(self, i: int) -> None:
        self.state[self._params[i]] = {"step": torch.tensor(float(self._steps[i])), "exp_avg": self._exp_avgs[i],
                                       "exp_avg_sq": self._exp_avg_sqs[i]}

    def load_state_dict(self, state_dict) -> None:
        groups = state_dict["param_groups"]
        if len(groups) != 1 or any(groups[0].get(k) for k in ("weight_decay", "amsgrad", "maximize")):
            raise ValueError("FlatAdam runs one group of plain Adam (no weight decay, amsgrad or maximize); this state "
                             "asks for more: load it into torch.optim.Adam")
        super().load_state_dict(state_dict)  # torch's checks and casts; it leaves fresh tensors in self.state
        with torch.no_grad():
            for i, p in enumerate(self._params):
                loaded = self.state.pop(p, None)
                if loaded is None:  # no state saved for it: it starts afresh at its next update
                    self._exp_avgs[i].zero_(), self._exp_avg_sqs[i].zero_()
                    self._steps[i] = 0
                    continue
                self._exp_avgs[i].copy_(loaded["exp_avg"]), self._exp_avg_sqs[i].copy_(loaded["exp_avg_sq"])
                self._steps[i] = int(float(loaded["step"]))
                self._new_state(i)
