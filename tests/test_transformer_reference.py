"""The shared Transformer against PyTorch's own layers, with weights copied across (fp32, atol 1e-5)."""

import pytest
import torch
from torch import nn

from proofs.transformer import (
    DecoderLayer,
    EncoderLayer,
    MultiHeadAttention,
    TransformerConfig,
    causal_mask,
    record_attention,
)

ATOL = 1e-5
CFG = TransformerConfig(d_model=32, n_heads=4, d_ff=64, dropout_emb=0.0, dropout_residual=0.0)


def copy_mha(ours: MultiHeadAttention, ref: nn.MultiheadAttention) -> None:
    with torch.no_grad():
        ref.in_proj_weight.copy_(torch.cat([ours.w_q.weight, ours.w_k.weight, ours.w_v.weight]))
        ref.in_proj_bias.copy_(torch.cat([ours.w_q.bias, ours.w_k.bias, ours.w_v.bias]))
        ref.out_proj.weight.copy_(ours.w_o.weight)
        ref.out_proj.bias.copy_(ours.w_o.bias)


def copy_sublayers(ours, ref, pairs) -> None:
    with torch.no_grad():
        for a, b in pairs:
            b.weight.copy_(a.weight)
            b.bias.copy_(a.bias)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.mark.parametrize("fast", [True, False])
@pytest.mark.parametrize("masking", ["none", "causal", "padding"])
def test_attention_matches_torch_mha(fast, masking):
    ours = MultiHeadAttention(CFG.replace(attn_impl="auto" if fast else "explicit")).eval()
    ref = nn.MultiheadAttention(32, 4, batch_first=True).eval()
    copy_mha(ours, ref)
    x = torch.randn(3, 7, 32)
    kpm = torch.zeros(3, 7, dtype=torch.bool)
    kpm[1, 5:] = True
    kpm[2, 3:] = True
    kw = {}
    rk = {}
    if masking == "causal":
        kw, rk = {"causal": True}, {"attn_mask": causal_mask(7)}
    elif masking == "padding":
        kw, rk = {"key_padding_mask": kpm}, {"key_padding_mask": kpm}
    with torch.no_grad():
        y_ref, w_ref = ref(x, x, x, need_weights=True, average_attn_weights=False, **rk)
        if fast:
            y = ours(x, **kw)
        else:
            with record_attention(ours):
                y = ours(x, **kw)
            torch.testing.assert_close(ours.weights, w_ref, atol=ATOL, rtol=0)
    torch.testing.assert_close(y, y_ref, atol=ATOL, rtol=0)


def test_cross_attention_matches_torch_mha():
    ours = MultiHeadAttention(CFG).eval()
    ref = nn.MultiheadAttention(32, 4, batch_first=True).eval()
    copy_mha(ours, ref)
    x, mem = torch.randn(2, 5, 32), torch.randn(2, 9, 32)
    with torch.no_grad():
        torch.testing.assert_close(ours(x, mem), ref(x, mem, mem)[0], atol=ATOL, rtol=0)


@pytest.mark.parametrize("norm_position", ["post", "pre"])
def test_encoder_layer_matches_torch(norm_position):
    cfg = CFG.replace(norm_position=norm_position)
    ours = EncoderLayer(cfg).eval()
    ref = nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True, norm_first=norm_position == "pre").eval()
    copy_mha(ours.self_attn, ref.self_attn)
    copy_sublayers(ours, ref, [(ours.ffn.lin1, ref.linear1), (ours.ffn.lin2, ref.linear2),
                               (ours.sub_attn.norm, ref.norm1), (ours.sub_ffn.norm, ref.norm2)])
    x = torch.randn(4, 6, 32)
    kpm = torch.zeros(4, 6, dtype=torch.bool)
    kpm[0, 4:] = True
    with torch.no_grad():
        torch.testing.assert_close(ours(x, kpm), ref(x, src_key_padding_mask=kpm), atol=ATOL, rtol=0)
        torch.testing.assert_close(ours(x), ref(x), atol=ATOL, rtol=0)


@pytest.mark.parametrize("norm_position", ["post", "pre"])
def test_decoder_layer_matches_torch(norm_position):
    cfg = CFG.replace(norm_position=norm_position)
    ours = DecoderLayer(cfg).eval()
    ref = nn.TransformerDecoderLayer(32, 4, 64, dropout=0.0, batch_first=True, norm_first=norm_position == "pre").eval()
    copy_mha(ours.self_attn, ref.self_attn)
    copy_mha(ours.cross_attn, ref.multihead_attn)
    copy_sublayers(ours, ref, [(ours.ffn.lin1, ref.linear1), (ours.ffn.lin2, ref.linear2),
                               (ours.sub_self.norm, ref.norm1), (ours.sub_cross.norm, ref.norm2),
                               (ours.sub_ffn.norm, ref.norm3)])
    x, mem = torch.randn(2, 5, 32), torch.randn(2, 8, 32)
    mpm = torch.zeros(2, 8, dtype=torch.bool)
    mpm[1, 6:] = True
    with torch.no_grad():
        y_ref = ref(x, mem, tgt_mask=causal_mask(5), memory_key_padding_mask=mpm)
        torch.testing.assert_close(ours(x, mem, memory_padding_mask=mpm), y_ref, atol=ATOL, rtol=0)


@pytest.mark.parametrize("overrides", [
    {}, {"attn_scale": "none"}, {"attn_scale": "dk"}, {"qk_norm": "layer"}, {"share_qk": True},
    {"qkv_proj": False}, {"qkv_proj": False, "qk_norm": "layer"}, {"qkv_proj": False, "attn_scale": "none"},
])
def test_fast_path_equals_explicit_path(overrides):
    cfg = CFG.replace(**overrides)
    fast = MultiHeadAttention(cfg).eval()
    slow = MultiHeadAttention(cfg.replace(attn_impl="explicit")).eval()
    slow.load_state_dict(fast.state_dict())
    x = torch.randn(2, 9, 32)
    kpm = torch.zeros(2, 9, dtype=torch.bool)
    kpm[1, 7:] = True
    assert fast.uses_fast_path() and not slow.uses_fast_path()
    with torch.no_grad():
        for kw in ({}, {"causal": True}, {"key_padding_mask": kpm}, {"causal": True, "key_padding_mask": kpm}):
            torch.testing.assert_close(fast(x, **kw), slow(x, **kw), atol=ATOL, rtol=0)


def test_recording_weights_turns_fast_path_off():
    attn = MultiHeadAttention(CFG).eval()
    with record_attention(attn):
        assert not attn.uses_fast_path()
        attn(torch.randn(1, 4, 32))
        assert attn.weights.shape == (1, 4, 4, 4)
        torch.testing.assert_close(attn.weights.sum(-1), torch.ones(1, 4, 4))
    assert attn.uses_fast_path()
