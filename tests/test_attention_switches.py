"""Attention switches of the shared module that no PyTorch layer has: checked against a few lines of plain torch."""

import pytest
import torch

from proofs.transformer import ConfigError, EncoderTagger, MultiHeadAttention, TransformerConfig, record_attention

CFG = TransformerConfig(d_model=32, n_heads=4, qkv_proj=False)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def test_no_projections_has_only_w_o():
    attn = MultiHeadAttention(CFG)
    with_proj = MultiHeadAttention(CFG.replace(qkv_proj=True))
    names = {n for n, _ in attn.named_parameters()}
    assert names == {"w_o.weight", "w_o.bias"}
    n_params = sum(p.numel() for p in attn.parameters())
    assert n_params == 32 * 32 + 32
    assert sum(p.numel() for p in with_proj.parameters()) == 4 * n_params


def test_no_projections_q_k_v_are_the_input_split_into_heads():
    attn = MultiHeadAttention(CFG)
    x, kv = torch.randn(2, 5, 32), torch.randn(2, 7, 32)
    q, k, v = attn.project(x, kv)
    torch.testing.assert_close(q, x.view(2, 5, 4, 8).transpose(1, 2), atol=0, rtol=0)
    torch.testing.assert_close(k, kv.view(2, 7, 4, 8).transpose(1, 2), atol=0, rtol=0)
    torch.testing.assert_close(v, k, atol=0, rtol=0)


@pytest.mark.parametrize("causal", [False, True])
def test_no_projections_matches_plain_softmax_attention(causal):
    """With W_O = I and no bias: y = softmax(x_h x_hᵀ / √d_k) x_h per head, concatenated."""
    cfg = CFG.replace(bias=False)
    attn = MultiHeadAttention(cfg).eval()
    with torch.no_grad():
        attn.w_o.weight.copy_(torch.eye(32))
    x = torch.randn(3, 6, 32)
    xh = x.view(3, 6, 4, 8).transpose(1, 2)  # (B, nh, T, hs)
    s = xh @ xh.transpose(-2, -1) / 8**0.5
    if causal:
        s = s.masked_fill(torch.ones(6, 6, dtype=torch.bool).triu(1), float("-inf"))
    ref = (torch.softmax(s, -1) @ xh).transpose(1, 2).reshape(3, 6, 32)
    with torch.no_grad():
        torch.testing.assert_close(attn(x, causal=causal), ref, atol=1e-5, rtol=0)
        with record_attention(attn):
            torch.testing.assert_close(attn(x, causal=causal), ref, atol=1e-5, rtol=0)
            torch.testing.assert_close(attn.weights, torch.softmax(s, -1), atol=1e-6, rtol=0)


def test_no_projections_model_trains_end_to_end():
    model = EncoderTagger(CFG.replace(vocab_size=16, n_layers=1, dropout_emb=0.0, dropout_residual=0.0))
    ids = torch.randint(1, 16, (4, 8))
    model(ids).sum().backward()
    assert all(p.grad is not None for p in model.parameters())


def test_no_projections_with_shared_qk_is_an_error():
    with pytest.raises(ConfigError, match=r"share_qk=True ties W_K to W_Q, but qkv_proj=False has no W_Q.*Set share_qk=False"):
        TransformerConfig(qkv_proj=False, share_qk=True)
    with pytest.raises(ConfigError, match="qkv_proj=False"):
        TransformerConfig(share_qk=True).replace(qkv_proj=False)
