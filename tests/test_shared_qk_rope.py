"""share_qk=True with rotary positions, which the page on separate W_Q and W_K relies on, checked against a few lines
of plain torch: explicit 2×2 rotation matrices per channel pair, not the module's apply_rope."""

import math

import torch

from proofs.transformer import TransformerConfig, make_self_attention, record_attention


def rotation(pos: int, d: int, base: float = 10000.0) -> torch.Tensor:
    """(d, d) block-diagonal rotation of the interleaved pairs (2i, 2i+1) by pos·base^(−2i/d)."""
    r = torch.zeros(d, d, dtype=torch.float64)
    for i in range(d // 2):
        a = pos * base ** (-2 * i / d)
        r[2 * i:2 * i + 2, 2 * i:2 * i + 2] = torch.tensor([[math.cos(a), -math.sin(a)], [math.sin(a), math.cos(a)]],
                                                           dtype=torch.float64)
    return r


def test_shared_qk_rope_weights_match_rotation_matrices_and_scores_are_symmetric():
    torch.manual_seed(0)
    cfg = TransformerConfig(d_model=16, n_heads=2, share_qk=True, positions="rope")
    attn = make_self_attention(cfg).double().eval()
    x = torch.randn(1, 6, 16, dtype=torch.float64)
    with torch.no_grad(), record_attention(attn):
        attn(x)
    q = (x[0] @ attn.w_q.weight.T + attn.w_q.bias).view(6, 2, 8)  # (T, h, d_k): keys use the same map
    for h in range(2):
        rot = torch.stack([rotation(p, 8) @ q[p, h] for p in range(6)])  # (T, d_k), rotated by position
        scores = rot @ rot.T / math.sqrt(8)
        torch.testing.assert_close(scores, scores.T, atol=1e-12, rtol=0)  # symmetric: relative and shared
        torch.testing.assert_close(attn.weights[0, h], torch.softmax(scores, -1), atol=1e-12, rtol=0)


def test_separate_qk_rope_scores_are_not_symmetric():
    torch.manual_seed(0)
    attn = make_self_attention(TransformerConfig(d_model=16, n_heads=2, positions="rope")).double().eval()
    x = torch.randn(1, 6, 16, dtype=torch.float64)
    q = (x[0] @ attn.w_q.weight.T + attn.w_q.bias).view(6, 2, 8)
    k = (x[0] @ attn.w_k.weight.T + attn.w_k.bias).view(6, 2, 8)
    rq = torch.stack([rotation(p, 8) @ q[p, 0] for p in range(6)])
    rk = torch.stack([rotation(p, 8) @ k[p, 0] for p in range(6)])
    s = rq @ rk.T
    assert (s - s.T).abs().max() > 1e-3
