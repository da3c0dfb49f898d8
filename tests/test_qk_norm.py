"""QK-norm and the attention-scale switches against independent formulas (F.layer_norm, F.rms_norm, a plain softmax).

The proof page "Why divide by √d_k?" trains with qk_norm="layer"/"rms" and attn_scale="learned"/"dk"; these tests
pin what those switches compute, on both the fused (SDPA) and the explicit path.
"""

import pytest
import torch
import torch.nn.functional as F

from proofs.transformer import MultiHeadAttention, TransformerConfig

B, T, C, NH = 2, 5, 24, 4
HS = C // NH


def cfg(**switches) -> TransformerConfig:
    return TransformerConfig(d_model=C, n_heads=NH, d_ff=48, dropout_emb=0.0, dropout_residual=0.0, **switches)


def heads(t: torch.Tensor) -> torch.Tensor:
    return t.view(B, T, NH, HS).transpose(1, 2)  # (B, nh, T, hs)


def reference(attn: MultiHeadAttention, x: torch.Tensor, norm: str, scale: torch.Tensor, causal: bool) -> torch.Tensor:
    """softmax(scale_h · norm(q) norm(k)ᵀ) v, written out with torch.nn.functional only."""
    q, k, v = heads(attn.w_q(x)), heads(attn.w_k(x)), heads(attn.w_v(x))
    if norm == "layer":
        q = F.layer_norm(q, (HS,), attn.q_norm.weight, attn.q_norm.bias, 1e-5)
        k = F.layer_norm(k, (HS,), attn.k_norm.weight, attn.k_norm.bias, 1e-5)
    elif norm == "rms":
        q = F.rms_norm(q, (HS,), attn.q_norm.weight, 1e-5)
        k = F.rms_norm(k, (HS,), attn.k_norm.weight, 1e-5)
    s = torch.einsum("bhid,bhjd->bhij", q, k) * scale.view(1, -1, 1, 1)
    if causal:
        s = s.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    y = torch.softmax(s, dim=-1) @ v  # (B, nh, T, hs)
    return attn.w_o(y.transpose(1, 2).reshape(B, T, C))


@pytest.mark.parametrize("norm", ["none", "layer", "rms"])
@pytest.mark.parametrize("impl", ["auto", "explicit"])
@pytest.mark.parametrize("causal", [False, True])
def test_learned_scale_with_qk_norm_matches_the_formula(norm, impl, causal):
    torch.manual_seed(0)
    attn = MultiHeadAttention(cfg(qk_norm=norm, attn_scale="learned", attn_impl=impl)).eval()
    with torch.no_grad():
        attn.scale.copy_(torch.rand(NH, 1, 1) + 0.1)  # a different temperature per head
        if norm != "none":
            attn.q_norm.weight.copy_(torch.randn(HS))
            attn.k_norm.weight.copy_(torch.randn(HS))
            if norm == "layer":
                attn.q_norm.bias.copy_(torch.randn(HS))
                attn.k_norm.bias.copy_(torch.randn(HS))
    assert attn.uses_fast_path() == (impl == "auto")
    x = torch.randn(B, T, C)
    with torch.no_grad():
        torch.testing.assert_close(attn(x, causal=causal), reference(attn, x, norm, attn.scale.flatten(), causal),
                                   atol=1e-5, rtol=0)


def test_learned_scale_starts_at_inv_sqrt_dk_and_gets_the_same_gradient_on_both_paths():
    torch.manual_seed(0)
    fast = MultiHeadAttention(cfg(qk_norm="layer", attn_scale="learned"))
    slow = MultiHeadAttention(cfg(qk_norm="layer", attn_scale="learned", attn_impl="explicit"))
    slow.load_state_dict(fast.state_dict())
    torch.testing.assert_close(fast.scale.flatten(), torch.full((NH,), HS**-0.5))
    x, r = torch.randn(B, T, C), torch.randn(B, T, C)
    for attn in (fast, slow):
        (attn(x) * r).sum().backward()
    assert fast.scale.grad.abs().min() > 0
    torch.testing.assert_close(fast.scale.grad, slow.scale.grad, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("switch,factor", [("sqrt_dk", HS**-0.5), ("dk", 1 / HS), ("none", 1.0)])
def test_fixed_scales_match_sdpa(switch, factor):
    torch.manual_seed(0)
    attn = MultiHeadAttention(cfg(attn_scale=switch, attn_impl="explicit")).eval()
    x = torch.randn(B, T, C)
    q, k, v = heads(attn.w_q(x)), heads(attn.w_k(x)), heads(attn.w_v(x))
    y = F.scaled_dot_product_attention(q, k, v, scale=factor).transpose(1, 2).reshape(B, T, C)
    with torch.no_grad():
        torch.testing.assert_close(attn(x), attn.w_o(y), atol=1e-5, rtol=0)


@pytest.mark.parametrize("norm", ["layer", "rms"])
def test_qk_norm_gives_every_query_and_key_length_sqrt_dk_whatever_the_weights(norm):
    """With the norm's gain at its initial value 1 (and LayerNorm's bias 0): |q| = |k| = √d_k up to eps."""
    torch.manual_seed(0)
    attn = MultiHeadAttention(cfg(qk_norm=norm)).eval()
    with torch.no_grad():
        attn.w_q.weight.mul_(50.0)
        x = torch.randn(B, T, C)
        q, k, _ = attn.project(x, x)
    for t in (q, k):
        torch.testing.assert_close(t.norm(dim=-1), torch.full(t.shape[:-1], HS**0.5), atol=1e-3, rtol=0)
