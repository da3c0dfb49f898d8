"""Coding drill: a LoRA linear layer.

Write `lora_forward(x, weight, bias, A, B, alpha)` and `lora_merge(weight, A, B, alpha)` (no peft, no
proofs.transformer.lora), then run `pytest proofs/drills/drill_lora.py`.
"""

import torch
from torch import Tensor

PAGE = "generation/lora.md"


def lora_forward(x: Tensor, weight: Tensor, bias: Tensor, A: Tensor, B: Tensor, alpha: float) -> Tensor:
    """x (..., d_in) -> (..., d_out): the frozen layer x Wᵀ + b plus the low-rank path (alpha / r) · x Aᵀ Bᵀ,
    with A (r, d_in) and B (d_out, r). Do not form the (d_out, d_in) product B A."""
    raise NotImplementedError("write the LoRA forward here")


def lora_merge(weight: Tensor, A: Tensor, B: Tensor, alpha: float) -> Tensor:
    """The merged weight (d_out, d_in) of an ordinary linear layer computing the same function."""
    raise NotImplementedError("write the merge here")


# ---- the checks (leave them as they are) ------------------------------------------------------------
import pytest  # noqa: E402

from proofs.drills import pick  # noqa: E402
from proofs.transformer import LoRALinear  # noqa: E402


def _layer(d_in=12, d_out=10, r=3, alpha=6.0, seed=0) -> LoRALinear:
    torch.manual_seed(seed)
    layer = LoRALinear(torch.nn.Linear(d_in, d_out), r=r, alpha=alpha)
    with torch.no_grad():
        layer.B.normal_()  # as after some training: B no longer zero
    return layer


def forward_reference(x, weight, bias, A, B, alpha):
    layer = _layer()
    with torch.no_grad():
        layer.base.weight.copy_(weight), layer.base.bias.copy_(bias), layer.A.copy_(A), layer.B.copy_(B)
        layer.alpha, layer.scaling = alpha, alpha / A.shape[0]
        return layer(x)  # the shared model's own LoRALinear


def merge_reference(weight, A, B, alpha):
    layer = _layer()
    with torch.no_grad():
        layer.base.weight.copy_(weight), layer.A.copy_(A), layer.B.copy_(B)
        layer.alpha, layer.scaling = alpha, alpha / A.shape[0]
        return layer.merge().weight


def _args():
    layer = _layer()
    x = torch.randn(4, 7, 12, generator=torch.Generator().manual_seed(1))
    return x, layer.base.weight.detach(), layer.base.bias.detach(), layer.A.detach(), layer.B.detach(), 6.0


def test_forward_matches_the_shared_model():
    f = pick(lora_forward, forward_reference)
    x, w, b, A, B, alpha = _args()
    torch.testing.assert_close(f(x, w, b, A, B, alpha), forward_reference(x, w, b, A, B, alpha))


def test_scaling_is_alpha_over_r():
    f = pick(lora_forward, forward_reference)
    x, w, b, A, B, alpha = _args()
    base = x @ w.T + b
    torch.testing.assert_close(f(x, w, b, A, B, 2 * alpha) - base, 2 * (f(x, w, b, A, B, alpha) - base))


def test_merged_weight_gives_the_same_outputs():
    merge = pick(lora_merge, merge_reference)
    x, w, b, A, B, alpha = _args()
    torch.testing.assert_close(x @ merge(w, A, B, alpha).T + b, forward_reference(x, w, b, A, B, alpha), atol=1e-5,
                               rtol=1e-5)
