"""Grouped-query attention (n_kv_heads) against independent references.

n_kv_heads = n_heads is multi-head attention; n_kv_heads < n_heads equals a multi-head attention whose key and
value heads are copies (query head h reads key/value head h // (n_heads / n_kv_heads)); both agree with
torch's F.scaled_dot_product_attention on explicitly repeated heads and with its enable_gqa switch; the cache
keeps n_kv heads only.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from proofs.transformer import ConfigError, DecoderLM, MultiHeadAttention, TransformerConfig, causal_mask, repeat_kv

C, NH = 32, 8


def cfg(**kw) -> TransformerConfig:
    base = dict(vocab_size=16, d_model=C, n_heads=NH, d_ff=64, n_layers=2, dropout_emb=0.0, dropout_residual=0.0)
    return TransformerConfig(**{**base, **kw})


def as_mha(gqa: MultiHeadAttention) -> MultiHeadAttention:
    """A multi-head attention (n_kv_heads = n_heads) whose W_K, W_V rows repeat the GQA module's key/value heads."""
    mha = MultiHeadAttention(gqa.cfg.replace(n_kv_heads=None)).to(gqa.w_q.weight.dtype)
    rep, hs = gqa.n_heads // gqa.n_kv, gqa.d_head
    state = gqa.state_dict()
    for name in ("w_k", "w_v"):
        w = state[f"{name}.weight"].view(gqa.n_kv, hs, C)  # one block of rows per key/value head
        state[f"{name}.weight"] = w.repeat_interleave(rep, dim=0).reshape(NH * hs, C)
        b = state[f"{name}.bias"].view(gqa.n_kv, hs)
        state[f"{name}.bias"] = b.repeat_interleave(rep, dim=0).reshape(NH * hs)
    mha.load_state_dict(state)
    return mha.eval()


@pytest.mark.parametrize("attn_impl", ["auto", "explicit", "tiled"])
def test_n_kv_equal_to_n_heads_is_multi_head_attention(attn_impl):
    torch.manual_seed(0)
    a = MultiHeadAttention(cfg(attn_impl=attn_impl)).eval()
    b = MultiHeadAttention(cfg(attn_impl=attn_impl, n_kv_heads=NH)).eval()
    b.load_state_dict(a.state_dict())
    x = torch.randn(3, 10, C)
    assert torch.equal(a(x, causal=True), b(x, causal=True))


@pytest.mark.parametrize("n_kv", [1, 2, 4])
@pytest.mark.parametrize("attn_impl", ["auto", "explicit", "tiled"])
@pytest.mark.parametrize("causal", [False, True])
def test_gqa_equals_mha_with_repeated_key_value_heads(n_kv, attn_impl, causal):
    torch.manual_seed(n_kv)
    gqa = MultiHeadAttention(cfg(n_kv_heads=n_kv, attn_impl=attn_impl, attn_block=4)).double().eval()
    mha = as_mha(gqa)
    x = torch.randn(2, 9, C, dtype=torch.float64)
    pad = torch.zeros(2, 9, dtype=torch.bool)
    pad[1, 6:] = True
    y_gqa = gqa(x, causal=causal, key_padding_mask=pad)
    y_mha = mha(x, causal=causal, key_padding_mask=pad)
    assert (y_gqa - y_mha).abs().max().item() < 1e-12


@pytest.mark.parametrize("n_kv", [1, 2, 4, 8])
def test_gqa_matches_torch_sdpa_with_repeated_heads_and_enable_gqa(n_kv):
    torch.manual_seed(1)
    attn = MultiHeadAttention(cfg(n_kv_heads=n_kv, attn_impl="explicit")).double().eval()
    x = torch.randn(2, 7, C, dtype=torch.float64)
    q = attn.project_q(x)  # (B, nh, T, hs)
    k, v = attn.project_kv(x)  # (B, n_kv, T, hs)
    rep = NH // n_kv
    ref = F.scaled_dot_product_attention(q, k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1), is_causal=True)
    ref = attn.w_o(ref.transpose(1, 2).reshape(2, 7, C))
    assert (attn(x, causal=True) - ref).abs().max().item() < 1e-12
    if "enable_gqa" not in (F.scaled_dot_product_attention.__doc__ or ""):
        pytest.skip("this torch's scaled_dot_product_attention has no enable_gqa")
    native = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)  # torch >= 2.5
    native = attn.w_o(native.transpose(1, 2).reshape(2, 7, C))
    assert (attn(x, causal=True) - native).abs().max().item() < 1e-12


def test_query_head_h_reads_key_value_head_h_div_group():
    """repeat_kv interleaves: with 8 query heads and 2 key/value heads, heads 0-3 read head 0 and 4-7 read head 1."""
    kv = torch.arange(2.0)[None, :, None, None].expand(1, 2, 3, 4)  # head index as the value
    out = repeat_kv(kv, 4)
    assert out[0, :, 0, 0].tolist() == [0, 0, 0, 0, 1, 1, 1, 1]
    # the other order (head h reads h % n_kv) is a different model: outputs differ
    torch.manual_seed(2)
    gqa = MultiHeadAttention(cfg(n_kv_heads=2, attn_impl="explicit")).double().eval()
    wrong = as_mha(gqa)
    state = gqa.state_dict()
    for name in ("w_k", "w_v"):
        state[f"{name}.weight"] = state[f"{name}.weight"].view(2, 4, C).repeat(4, 1, 1).reshape(NH * 4, C)
        state[f"{name}.bias"] = state[f"{name}.bias"].view(2, 4).repeat(4, 1).reshape(NH * 4)
    wrong.load_state_dict(state)
    x = torch.randn(2, 6, C, dtype=torch.float64)
    assert (gqa(x) - wrong(x)).abs().max().item() > 1e-3


@pytest.mark.parametrize("n_kv", [1, 2, 8])
def test_cache_keeps_n_kv_heads_and_decoding_matches_the_full_pass(n_kv):
    torch.manual_seed(3)
    lm = DecoderLM(cfg(n_kv_heads=n_kv, norm_position="pre")).eval()
    ids = torch.randint(1, 16, (2, 6))
    cache = lm.decoder.new_cache()
    steps = [lm(ids[:, :3], cache=cache)] + [lm(ids[:, t:t + 1], cache=cache) for t in range(3, 6)]
    assert torch.allclose(torch.cat(steps, 1), lm(ids), atol=1e-5)
    k, v = cache[0]["self"].entries
    assert k.shape == v.shape == (2, n_kv, 6, C // NH)
    assert cache[0]["self"].nbytes == 2 * n_kv * (C // NH) * 6 * 2 * 4


def test_bad_head_counts_raise_config_error_naming_the_fix():
    with pytest.raises(ConfigError, match=r"n_kv_heads=3 must divide n_heads=8.*Pick n_kv_heads from \[1, 2, 4, 8\]"):
        cfg(n_kv_heads=3)
    with pytest.raises(ConfigError, match="must divide"):
        cfg(n_kv_heads=0)
    with pytest.raises(ConfigError, match="share_qk=True cannot use one matrix"):
        cfg(n_kv_heads=2, share_qk=True)


def test_mask_shapes_follow_query_heads_not_key_value_heads():
    """A causal GQA layer hides the same keys as the MHA one: weights above the diagonal are exactly 0."""
    from proofs.transformer import record_attention

    torch.manual_seed(4)
    attn = MultiHeadAttention(cfg(n_kv_heads=2)).eval()
    with record_attention(attn):
        attn(torch.randn(2, 5, C), causal=True)
    assert attn.weights.shape == (2, NH, 5, 5)
    assert attn.weights[..., causal_mask(5)].abs().max().item() == 0.0
