"""Coding drill: scaled dot-product attention with causal and padding masks.

Write `attention(q, k, v, causal, key_padding_mask)` from matmuls and a softmax (no
F.scaled_dot_product_attention), then run `pytest proofs/drills/drill_masked_attention.py`.
"""

import torch
from torch import Tensor

PAGE = "attention/masks.md"


def attention(q: Tensor, k: Tensor, v: Tensor, causal: bool = False, key_padding_mask: Tensor | None = None) -> Tensor:
    """softmax(q kᵀ / sqrt(d_k) + mask) v for q (B, h, Tq, d), k and v (B, h, Tk, d).

    causal: query i may not see key j > i (queries aligned at the end of the keys when Tq < Tk).
    key_padding_mask: (B, Tk) bool, True at padding keys, which no query may see.
    """
    raise NotImplementedError("write masked attention here")


# ---- the checks (leave them as they are) ------------------------------------------------------------
import pytest  # noqa: E402

from proofs.drills import pick  # noqa: E402
from proofs.transformer import MultiHeadAttention, TransformerConfig, end_aligned, hidden  # noqa: E402


def reference(q: Tensor, k: Tensor, v: Tensor, causal: bool = False, key_padding_mask: Tensor | None = None) -> Tensor:
    """The shared model's explicit path: its score, its position-built mask, softmax, its mix."""
    B, h, Tq, d = q.shape
    attn = MultiHeadAttention(TransformerConfig(d_model=h * d, n_heads=h, attn_impl="explicit"))
    s = attn.score(q, k)
    hide = hidden(*end_aligned(Tq, k.shape[2]), causal) if causal else None
    if key_padding_mask is not None:
        pad = key_padding_mask[:, None, None, :]
        hide = pad if hide is None else hide | pad
    if hide is not None:
        s = s.masked_fill(hide, float("-inf"))
    return attn.mix(torch.softmax(s, -1), v)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("tq", [6, 2])
def test_matches_the_shared_model(causal, tq):
    f = pick(attention, reference)
    g = torch.Generator().manual_seed(6)
    q, k, v = torch.randn(2, 3, tq, 8, generator=g), torch.randn(2, 3, 6, 8, generator=g), torch.randn(2, 3, 6, 8, generator=g)
    pad = torch.tensor([[False] * 6, [False] * 4 + [True] * 2])
    torch.testing.assert_close(f(q, k, v, causal, pad), reference(q, k, v, causal, pad))


def test_the_future_and_the_padding_do_not_leak():
    f = pick(attention, reference)
    g = torch.Generator().manual_seed(7)
    q, k, v = torch.randn(1, 1, 5, 4, generator=g), torch.randn(1, 1, 5, 4, generator=g), torch.randn(1, 1, 5, 4, generator=g)
    v2 = v.clone()
    v2[..., 3:, :] += 100.0  # change the last two values
    torch.testing.assert_close(f(q, k, v, True)[..., :3, :], f(q, k, v2, True)[..., :3, :])
    pad = torch.tensor([[False, False, False, True, True]])
    torch.testing.assert_close(f(q, k, v, False, pad), f(q, k, v2, False, pad))
