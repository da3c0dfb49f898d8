"""Coding drill: rotary position embedding (RoPE), interleaved pairs.

Write `rope(x, positions, base)`, then run `pytest proofs/drills/drill_rope.py`.
"""

import torch
from torch import Tensor

PAGE = "relative/rope.md"


def rope(x: Tensor, positions: Tensor, base: float = 10000.0) -> Tensor:
    """Rotate each pair of channels (2i, 2i+1) of x (B, heads, T, d) by the angle positions[t] · base^(-2i/d).

    positions: (T,) integers. (a, b) -> (a cos θ - b sin θ, a sin θ + b cos θ).
    """
    raise NotImplementedError("write RoPE here")


# ---- the checks (leave them as they are) ------------------------------------------------------------
from proofs.drills import pick  # noqa: E402
from proofs.transformer import apply_rope, rope_cos_sin, rope_inv_freq  # noqa: E402


def reference(x: Tensor, positions: Tensor, base: float = 10000.0) -> Tensor:
    cos, sin = rope_cos_sin(positions[None], rope_inv_freq(x.shape[-1], base), x.dtype)  # the shared model's RoPE
    return apply_rope(x, cos, sin, "interleaved")


def test_matches_the_shared_model():
    f = pick(rope, reference)
    x = torch.randn(2, 3, 9, 16, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    pos = torch.arange(9) + 5
    torch.testing.assert_close(f(x, pos), reference(x, pos))


def test_scores_depend_only_on_the_offset():
    f = pick(rope, reference)
    g = torch.Generator().manual_seed(5)
    q, k = torch.randn(1, 1, 1, 8, generator=g, dtype=torch.float64), torch.randn(1, 1, 1, 8, generator=g, dtype=torch.float64)
    s = lambda m, n: (f(q, torch.tensor([m])) * f(k, torch.tensor([n]))).sum()  # noqa: E731
    torch.testing.assert_close(s(7, 3), s(104, 100))
    torch.testing.assert_close(f(q, torch.tensor([11])).norm(), q.norm())
