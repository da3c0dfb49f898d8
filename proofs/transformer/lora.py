"""LoRA (Hu et al. 2021): a frozen linear layer plus a trainable low-rank update, and merging it back.

    y = x Wᵀ + b + (α / r) · x Aᵀ Bᵀ         A: (r, d_in), B: (d_out, r), W and b frozen

The wrapped model starts at the base model when W_frozen + (α/r)·B A = W. The paper keeps W and starts B at
zero, A random Gaussian (§4.1); PiSSA (Meng et al. 2024) instead starts A, B at W's top-r singular part and
freezes W − (α/r)·B A (init="pissa"). After training, W_frozen + (α/r)·B A is an ordinary weight of the same
shape: `merge()` returns a plain nn.Linear, so the adapted model runs the base model's ops, no extra latency.
Trainable parameters per wrapped matrix: r · (d_in + d_out), against d_in · d_out for full fine-tuning.
"""

from __future__ import annotations

import copy
import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

# Which factor starts at zero (the paper: b_zero). "split": neither is zero, yet B A = 0 exactly: A's first
# ceil(r/2) rows and B's last r - ceil(r/2) columns are random, the rest zero, so every rank-one term
# B[:, k] A[k, :] has a zero factor (needs r >= 2). "pissa": neither factor nor B A is zero: A, B from the
# top-r SVD of W, frozen weight W − (α/r)·B A (needs r <= min(d_in, d_out), checked below like every init).
INITS = ("b_zero", "a_zero", "both_zero", "both_random", "split", "pissa")


class LoRALinear(nn.Module):
    """A frozen nn.Linear `base` plus (alpha / r) · B A, with B A of rank at most r."""

    def __init__(self, base: nn.Linear, r: int, alpha: float, init: str = "b_zero"):
        super().__init__()
        if not isinstance(base, nn.Linear):
            raise TypeError(f"LoRALinear wraps an nn.Linear, got {type(base).__name__}.")
        d_out, d_in = base.weight.shape
        if not 0 < r <= min(d_in, d_out):
            raise ValueError(f"LoRA rank r={r} must be in 1..min(d_in, d_out) = {min(d_in, d_out)} for a "
                             f"{d_in}->{d_out} layer: a larger r is no longer low-rank (use full fine-tuning).")
        if init not in INITS:
            raise ValueError(f"init={init!r}: choose one of {INITS} (the paper's choice is 'b_zero').")
        if init == "split" and r < 2:
            raise ValueError("init='split' puts half of the rank in A and half in B: it needs r >= 2.")
        if init == "pissa":
            base = copy.deepcopy(base)  # its weight becomes the residual; the caller's layer is left as it was
        self.base, self.r, self.alpha, self.scaling, self.init = base, r, alpha, alpha / r, init
        for p in base.parameters():
            p.requires_grad_(False)
        self.A = nn.Parameter(torch.zeros(r, d_in, dtype=base.weight.dtype))   # (r, d_in): reads the input
        self.B = nn.Parameter(torch.zeros(d_out, r, dtype=base.weight.dtype))  # (d_out, r): writes the output
        if init in ("b_zero", "both_random"):
            nn.init.normal_(self.A, std=1 / math.sqrt(d_in))   # random Gaussian A (variance 1/d_in)
        if init in ("a_zero", "both_random"):
            nn.init.normal_(self.B, std=1 / math.sqrt(r))
        if init == "split":
            h = (r + 1) // 2
            with torch.no_grad():
                self.A[:h].normal_(std=1 / math.sqrt(d_in))     # rows 0..h-1 of A random, the rest zero
                self.B[:, h:].normal_(std=1 / math.sqrt(r))     # columns h..r-1 of B random, the rest zero
        if init == "pissa":
            with torch.no_grad():
                U, S, Vh = torch.linalg.svd(base.weight, full_matrices=False)  # (d_out, k), (k,), (k, d_in)
                root = (S[:r] / self.scaling).sqrt()                         # s·B A = U_r diag(S_r) Vh_r
                self.B.copy_(U[:, :r] * root)                                   # (d_out, r)
                self.A.copy_(root[:, None] * Vh[:r])                            # (r, d_in)
                base.weight.sub_(self.delta())  # frozen residual W − s·B A: the sum still equals W

    def delta(self) -> Tensor:
        """(alpha / r) · B A, shape (d_out, d_in): the update to the frozen weight."""
        return self.scaling * self.B @ self.A

    def forward(self, x: Tensor) -> Tensor:
        """x (..., d_in) -> (..., d_out): the frozen layer plus the low-rank path through r numbers per token."""
        return self.base(x) + self.scaling * F.linear(F.linear(x, self.A), self.B)  # (..., r) then (..., d_out)

    @torch.no_grad()
    def merge(self) -> nn.Linear:
        """A plain nn.Linear with weight W + (alpha/r) B A and the same bias: the same function, the base's cost."""
        out = nn.Linear(self.base.in_features, self.base.out_features, bias=self.base.bias is not None,
                        dtype=self.base.weight.dtype)
        out.weight.copy_(self.base.weight + self.delta())
        if self.base.bias is not None:
            out.bias.copy_(self.base.bias)
        return out


def apply_lora(model: nn.Module, targets: tuple[str, ...] = ("w_q", "w_v"), r: int = 4, alpha: float = 8.0,
               init: str = "b_zero") -> list[str]:
    """Freeze every parameter of `model`, then wrap each nn.Linear child whose attribute name is in `targets`
    (e.g. w_q, w_k, w_v, w_o of attention, lin1, lin2 of the FFN) in a LoRALinear. Returns the wrapped paths."""
    names = sorted({n for m in model.modules() for n, c in m.named_children() if isinstance(c, nn.Linear)})
    unknown = sorted(set(targets) - set(names))
    if unknown or not targets:
        raise ValueError(f"apply_lora: no nn.Linear named {unknown or '(no targets given)'} in this model; its linear "
                         f"layers are named {names}.")
    for p in model.parameters():
        p.requires_grad_(False)
    wrapped = []
    for path, module in list(model.named_modules()):
        for name, child in list(module.named_children()):
            if name in targets and isinstance(child, nn.Linear):
                setattr(module, name, LoRALinear(child, r, alpha, init))
                wrapped.append(f"{path}.{name}" if path else name)
    return wrapped


def merge_lora(model: nn.Module) -> nn.Module:
    """Replace every LoRALinear in `model` by its merged nn.Linear (in place); returns the model."""
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, LoRALinear):
                setattr(module, name, child.merge())
    return model


def trainable_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
