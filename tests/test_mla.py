"""Multi-head latent attention (kv_latent, mla_rope_dim, mla_absorb) against independent references.

Without RoPE, materialised MLA is a multi-head attention whose key and value maps have rank d_c:
W_K = W_UK W_DKV, W_V = W_UV W_DKV. The absorbed form gives the same outputs; decoding with a cache of latents
gives the full pass's logits; the cache holds d_c (+ d_r) numbers per token and layer.
"""

from __future__ import annotations

import pytest
import torch

from proofs.transformer import (AbsorbedLatentAttention, ConfigError, DecoderLM, LatentAttention, MultiHeadAttention,
                                TransformerConfig)

C, NH, DC = 32, 4, 12


def cfg(**kw) -> TransformerConfig:
    base = dict(vocab_size=16, d_model=C, n_heads=NH, d_ff=64, n_layers=2, dropout_emb=0.0, dropout_residual=0.0,
                kv_latent=DC)
    return TransformerConfig(**{**base, **kw})


def twins(**kw):
    torch.manual_seed(0)
    mat = LatentAttention(cfg(**kw)).double().eval()
    absd = AbsorbedLatentAttention(cfg(mla_absorb=True, **kw)).double().eval()
    absd.load_state_dict(mat.state_dict())
    return mat, absd


def test_materialised_mla_is_multi_head_attention_with_low_rank_key_and_value_maps():
    torch.manual_seed(1)
    mla = LatentAttention(cfg(bias=False)).double().eval()
    mha = MultiHeadAttention(cfg(bias=False, kv_latent=0)).double().eval()
    with torch.no_grad():
        mha.w_q.weight.copy_(mla.w_q.weight)
        mha.w_o.weight.copy_(mla.w_o.weight)
        mha.w_k.weight.copy_(mla.w_uk.weight @ mla.w_dkv.weight)  # (C, d_c) @ (d_c, C): rank d_c
        mha.w_v.weight.copy_(mla.w_uv.weight @ mla.w_dkv.weight)
    x = torch.randn(2, 7, C, dtype=torch.float64)
    assert (mla(x, causal=True) - mha(x, causal=True)).abs().max().item() < 1e-12
    assert torch.linalg.matrix_rank(mha.w_k.weight).item() == DC


@pytest.mark.parametrize("rope", [False, True])
@pytest.mark.parametrize("causal", [False, True])
def test_absorbed_equals_materialised(rope, causal):
    kw = dict(positions="rope", mla_rope_dim=4) if rope else {}
    mat, absd = twins(**kw)
    x = torch.randn(3, 9, C, dtype=torch.float64)
    assert (mat(x, causal=causal) - absd(x, causal=causal)).abs().max().item() < 1e-12


@pytest.mark.parametrize("absorb", [False, True])
@pytest.mark.parametrize("rope", [False, True])
def test_cached_decoding_equals_the_full_pass_and_caches_latents(absorb, rope):
    kw = dict(positions="rope", mla_rope_dim=4) if rope else {}
    torch.manual_seed(2)
    lm = DecoderLM(cfg(mla_absorb=absorb, norm_position="pre", **kw)).eval()
    ids = torch.randint(1, 16, (2, 7))
    cache = lm.decoder.new_cache()
    steps = [lm(ids[:, :3], cache=cache)] + [lm(ids[:, t:t + 1], cache=cache) for t in range(3, 7)]
    assert torch.allclose(torch.cat(steps, 1), lm(ids), atol=1e-5)
    entries = cache[0]["self"].entries
    assert [tuple(e.shape) for e in entries] == [(2, 1, 7, DC)] + ([(2, 1, 7, 4)] if rope else [])
    assert cache[0]["self"].nbytes == 2 * 7 * (DC + (4 if rope else 0)) * 4


def test_scale_counts_the_rotary_channels():
    mat = LatentAttention(cfg(positions="rope", mla_rope_dim=4))
    assert mat.scale == pytest.approx((C // NH + 4) ** -0.5)  # DeepSeek-V2 eq. 18: 1/sqrt(d_h + d_h^R)


def test_bad_mla_settings_raise_config_error_naming_the_fix():
    with pytest.raises(ConfigError, match="set mla_rope_dim to an even number"):
        cfg(positions="rope")
    with pytest.raises(ConfigError, match="set mla_rope_dim to an even number"):
        cfg(positions="rope", mla_rope_dim=3)
    with pytest.raises(ConfigError, match="n_kv_heads=None"):
        cfg(n_kv_heads=2)
    with pytest.raises(ConfigError, match="set kv_latent > 0 too"):
        cfg(kv_latent=0, mla_absorb=True)
    with pytest.raises(ConfigError, match="not positions='alibi'"):
        cfg(positions="alibi")
