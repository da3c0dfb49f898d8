"""Coding drill: a SwiGLU feed-forward block.

Write `swiglu(x, w1, v, w2)`, then run `pytest proofs/drills/drill_swiglu.py`.
"""

import torch
import torch.nn.functional as F  # noqa: F401  (F.silu is allowed)
from torch import Tensor

PAGE = "blocks/swiglu.md"


def swiglu(x: Tensor, w1: Tensor, v: Tensor, w2: Tensor) -> Tensor:
    """(SiLU(x W1ᵀ) ⊙ x Vᵀ) W2ᵀ, with nn.Linear's weight layout: w1, v (d_ff, d), w2 (d, d_ff); no biases."""
    raise NotImplementedError("write the SwiGLU FFN here")


# ---- the checks (leave them as they are) ------------------------------------------------------------
from proofs.drills import pick  # noqa: E402
from proofs.transformer import FeedForward, TransformerConfig  # noqa: E402


def reference(x: Tensor, w1: Tensor, v: Tensor, w2: Tensor) -> Tensor:
    cfg = TransformerConfig(d_model=w1.shape[1], d_ff=w1.shape[0], ffn_gated=True, activation="silu", bias=False)
    ffn = FeedForward(cfg)  # the shared model's own gated FFN
    with torch.no_grad():
        ffn.lin1.weight.copy_(w1), ffn.gate.weight.copy_(v), ffn.lin2.weight.copy_(w2)
    return ffn(x).detach()


def test_matches_the_shared_model():
    f = pick(swiglu, reference)
    g = torch.Generator().manual_seed(2)
    d, h = 12, 32
    x, w1, v, w2 = torch.randn(3, 5, d, generator=g), torch.randn(h, d, generator=g), torch.randn(h, d, generator=g), \
        torch.randn(d, h, generator=g)
    torch.testing.assert_close(f(x, w1, v, w2), reference(x, w1, v, w2))


def test_the_gate_matters():
    f = pick(swiglu, reference)
    g = torch.Generator().manual_seed(3)
    x, w1, w2 = torch.randn(2, 8, generator=g), torch.randn(16, 8, generator=g), torch.randn(8, 16, generator=g)
    assert f(x, w1, torch.zeros(16, 8), w2).abs().max() == 0  # a zero linear branch closes every gate
