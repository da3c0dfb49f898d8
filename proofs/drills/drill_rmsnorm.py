"""Coding drill: RMSNorm.

Write `rms_norm(x, weight, eps)` (no torch.nn.RMSNorm / F.rms_norm), then run `pytest proofs/drills/drill_rmsnorm.py`.
"""

import torch
from torch import Tensor

PAGE = "blocks/rmsnorm.md"


def rms_norm(x: Tensor, weight: Tensor, eps: float = 1e-5) -> Tensor:
    """x / sqrt(mean(x², last dim) + eps) · weight: LayerNorm without the mean subtraction and without a bias."""
    raise NotImplementedError("write RMSNorm here")


# ---- the checks (leave them as they are) ------------------------------------------------------------
import pytest  # noqa: E402

from proofs.drills import pick  # noqa: E402
from proofs.transformer import RMSNorm  # noqa: E402


def reference(x: Tensor, weight: Tensor, eps: float = 1e-5) -> Tensor:
    norm = RMSNorm(x.shape[-1], eps)  # the shared model's own RMSNorm
    with torch.no_grad():
        norm.weight.copy_(weight)
    return norm(x)


@pytest.mark.parametrize("shape", [(3, 5, 16), (2, 64)])
def test_matches_the_shared_model(shape):
    f = pick(rms_norm, reference)
    g = torch.Generator().manual_seed(1)
    x, w = torch.randn(shape, generator=g) * 3 + 1, torch.randn(shape[-1], generator=g)
    torch.testing.assert_close(f(x, w), reference(x, w).detach())


def test_no_centring_unlike_layernorm():
    f = pick(rms_norm, reference)
    x = torch.full((1, 8), 2.0)
    torch.testing.assert_close(f(x, torch.ones(8)), torch.ones(1, 8), atol=1e-4, rtol=0)  # LayerNorm would give 0
