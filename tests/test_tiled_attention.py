"""The tiled (online-softmax) attention path against the explicit softmax, torch's SDPA and a brute-force loop.

tiled_attention computes softmax(q kᵀ·scale + bias, masked) v one block of keys at a time with a running
max and sum; it must equal the other two paths to float tolerance for any shape, block size and mask.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from proofs.transformer import ConfigError, DecoderLM, MultiHeadAttention, TransformerConfig, tiled_attention

TOL = {torch.float64: 1e-12, torch.float32: 2e-6}


def brute_force(q, k, v, scale, hide=None):
    """out[b, h, i] = Σ_j softmax_j(q_i·k_j·scale) v_j with a Python loop over i and j (no matrix softmax)."""
    B, nh, tq, _ = q.shape
    out = torch.zeros(B, nh, tq, v.shape[-1], dtype=torch.float64)
    for i in range(tq):
        s = [(q[:, :, i] * k[:, :, j]).sum(-1).double() * scale for j in range(k.shape[2])]
        s = torch.stack(s, -1)  # (B, nh, Tk)
        if hide is not None:
            s = s.masked_fill(hide[:, :, i], float("-inf"))
        w = torch.exp(s - s.amax(-1, keepdim=True))
        out[:, :, i] = ((w / w.sum(-1, keepdim=True))[..., None] * v.double()).sum(-2)  # Σ_j a_ij v_j
    return out


@pytest.mark.parametrize("tq,tk,block", [(1, 1, 4), (5, 5, 2), (7, 13, 4), (16, 16, 16), (9, 30, 7), (3, 40, 64)])
def test_tiled_attention_equals_a_brute_force_loop(tq, tk, block):
    g = torch.Generator().manual_seed(tq * 100 + tk)
    q, k, v = (torch.randn(2, 3, t, 8, generator=g, dtype=torch.float64) * 2 for t in (tq, tk, tk))
    hide = torch.rand(2, 1, tq, tk, generator=g) < 0.3
    hide[..., 0] = False  # at least one visible key per row
    out = tiled_attention(q, k, v, 8**-0.5, block, lambda i, j: hide[:, :, i, j])
    assert (out - brute_force(q, k, v, 8**-0.5, hide)).abs().max().item() < 1e-12
    out = tiled_attention(q, k, v, 8**-0.5, block, lambda i, j: None)
    assert (out - brute_force(q, k, v, 8**-0.5)).abs().max().item() < 1e-12


def paths(dtype, block=4, **kw):
    base = dict(vocab_size=16, d_model=32, n_heads=4, d_ff=64, n_layers=2, dropout_emb=0.0, dropout_residual=0.0)
    torch.manual_seed(0)
    explicit = MultiHeadAttention(TransformerConfig(**{**base, **kw, "attn_impl": "explicit"})).to(dtype).eval()
    tiled = MultiHeadAttention(TransformerConfig(**{**base, **kw, "attn_impl": "tiled", "attn_block": block})).to(dtype).eval()
    fused = MultiHeadAttention(TransformerConfig(**{**base, **kw, "attn_impl": "auto"})).to(dtype).eval()
    tiled.load_state_dict(explicit.state_dict())
    fused.load_state_dict(explicit.state_dict())
    return explicit, tiled, fused


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("T,block", [(1, 4), (6, 4), (13, 4), (20, 8), (33, 16)])
@pytest.mark.parametrize("mask", ["none", "causal", "padding", "both", "window"])
def test_tiled_path_equals_explicit_and_sdpa(dtype, T, block, mask):
    kw = {"window": 3} if mask == "window" else {}
    explicit, tiled, fused = paths(dtype, block, **kw)
    x = torch.randn(3, T, 32, dtype=dtype, generator=torch.Generator().manual_seed(T))
    pad = None
    if mask in ("padding", "both"):
        pad = torch.zeros(3, T, dtype=torch.bool)
        pad[1, max(1, T - 3):] = True  # row 1 ends in padding; every row keeps its first key
    causal = mask in ("causal", "both", "window")
    ys = [m(x, causal=causal, key_padding_mask=pad) for m in (explicit, tiled, fused)]
    assert (ys[1] - ys[0]).abs().max().item() < TOL[dtype]
    assert (ys[1] - ys[2]).abs().max().item() < TOL[dtype]


def test_tiled_path_in_bfloat16_is_within_bfloat16_rounding_of_float64():
    explicit, tiled, _ = paths(torch.float64, block=4)
    x = torch.randn(2, 24, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    ref = explicit(x, causal=True)
    tiled_bf16 = tiled.to(torch.bfloat16)
    explicit_bf16 = explicit.to(torch.bfloat16)
    err_tiled = (tiled_bf16(x.bfloat16(), causal=True).double() - ref).abs().max().item()
    err_explicit = (explicit_bf16(x.bfloat16(), causal=True).double() - ref).abs().max().item()
    scale = ref.abs().max().item()
    assert err_tiled < 0.05 * scale  # bfloat16 keeps 8 significant bits: about 0.4 % per rounding
    assert err_tiled <= 2 * err_explicit + 1e-3 * scale  # accumulating in float32 is no worse than the explicit path


def test_tiled_path_with_a_position_bias_equals_explicit():
    explicit, tiled, _ = paths(torch.float64, block=4, positions="alibi")
    x = torch.randn(2, 11, 32, dtype=torch.float64)
    assert (explicit(x, causal=True) - tiled(x, causal=True)).abs().max().item() < 1e-12


def test_tiled_path_with_a_cache_and_rope_equals_the_full_pass():
    base = dict(vocab_size=16, d_model=32, n_heads=4, n_kv_heads=2, d_ff=64, n_layers=2, dropout_emb=0.0,
                dropout_residual=0.0, positions="rope", attn_impl="tiled", attn_block=3, norm_position="pre")
    torch.manual_seed(1)
    lm = DecoderLM(TransformerConfig(**base)).eval()
    ids = torch.randint(1, 16, (2, 9))
    cache = lm.decoder.new_cache()
    steps = [lm(ids[:, :4], cache=cache)] + [lm(ids[:, t:t + 1], cache=cache) for t in range(4, 9)]
    assert torch.allclose(torch.cat(steps, 1), lm(ids), atol=1e-5)


def test_online_softmax_survives_logits_that_overflow_a_naive_exp():
    """Scores of 1000 would overflow exp in any float type; the running max keeps every exponent <= 0."""
    q = torch.full((1, 1, 3, 4), 30.0)
    k = torch.full((1, 1, 5, 4), 30.0)
    v = torch.randn(1, 1, 5, 2)
    out = tiled_attention(q, k, v, 1.0 / math.sqrt(4), 2, lambda i, j: None)
    assert torch.isfinite(out).all()
    assert torch.allclose(out, F.scaled_dot_product_attention(q, k, v), atol=1e-6)


def test_tiled_with_attention_dropout_is_a_config_error():
    base = dict(vocab_size=16, d_model=32, n_heads=4, attn_impl="tiled", dropout_attn=0.1)
    with pytest.raises(ConfigError, match="dropout_attn=0.1 would be skipped silently"):
        MultiHeadAttention(TransformerConfig(**base))


def test_tiled_refuses_score_functions_it_cannot_tile():
    with pytest.raises(ConfigError, match="attn_impl='tiled' computes q·k block by block"):
        TransformerConfig(attn_impl="tiled", score_fn="additive")
    with pytest.raises(ConfigError, match="attn_impl='tiled'"):
        TransformerConfig(attn_impl="tiled", kv_latent=8, mla_absorb=True)
