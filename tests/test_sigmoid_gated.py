"""Sigmoid attention and gated attention (proofs/transformer/sigmoid_attention.py) against dense formulas written here,
and their decoding through the shared KV cache against the full forward."""

import math

import pytest
import torch

from proofs.transformer import ConfigError, GatedAttention, MixerConfig, SigmoidAttention, mixer_lm, record_attention



@pytest.fixture(autouse=True)
def float64():
    """Every test here in float64; the default goes back afterwards (a module-level switch leaked into the tests that
    ran next in the same process: 41 failures in other files)."""
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(before)


def cfg(**kw) -> MixerConfig:
    base = dict(vocab_size=11, d_model=16, n_heads=4, d_ff=32, n_layers=2, max_len=64, dropout_emb=0.0,
                dropout_residual=0.0, norm_position="pre")
    return MixerConfig(**{**base, **kw})


def heads(x, lin, nh):
    B, T, C = x.shape
    return lin(x).view(B, T, nh, C // nh).transpose(1, 2)  # (B, nh, T, hs)


def dense_sigmoid(m, x, bias=None, window=0):
    """σ(q·k/√d + b) on the visible keys (causal, optional window), b = bias or -log(keys seen by row i)."""
    nh = m.n_heads
    q, k, v = heads(x, m.w_q, nh), heads(x, m.w_k, nh), heads(x, m.w_v, nh)
    T = x.shape[1]
    s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    i, j = torch.arange(T)[:, None], torch.arange(T)[None]
    see = (j <= i) & ((i - j < window) if window else True)
    b = -torch.log(see.sum(-1, keepdim=True).double()) if bias is None else bias
    w = torch.sigmoid(s + b) * see
    y = (w @ v).transpose(1, 2).reshape(x.shape)
    return m.w_o(y), w


def dense_gated(m, x):
    """softmax attention, then Y ⊙ σ(x W_θ + b_θ), then W_O."""
    nh = m.n_heads
    q, k, v = heads(x, m.w_q, nh), heads(x, m.w_k, nh), heads(x, m.w_v, nh)
    T = x.shape[1]
    s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    s = s.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    y = (torch.softmax(s, -1) @ v).transpose(1, 2).reshape(x.shape)
    g = torch.sigmoid(x @ m.w_o.w_theta.weight.T + m.w_o.w_theta.bias)
    return (y * g) @ m.w_o.weight.T + m.w_o.bias


@pytest.mark.parametrize("bias,window", [(None, 0), (-2.0, 0), (None, 3)])
def test_sigmoid_attention_matches_dense_formula(bias, window):
    torch.manual_seed(0)
    m = SigmoidAttention(cfg(sigmoid_bias=bias, window=window))
    x = torch.randn(2, 9, 16)
    out, w = dense_sigmoid(m, x, bias, window)
    with record_attention(m):
        got = m(x, causal=True)
    assert torch.allclose(got, out, atol=1e-12)
    assert torch.allclose(m.weights, w.expand_as(m.weights), atol=1e-12)
    assert (m.weights.triu(1) == 0).all()  # keys after the query weigh exactly 0
    if bias is None and not window:  # row sums are not 1 (no normalisation)
        assert not torch.allclose(m.weights.sum(-1), torch.ones(()))


def test_gated_attention_matches_dense_formula():
    torch.manual_seed(1)
    m = GatedAttention(cfg())
    x = torch.randn(2, 7, 16)
    assert torch.allclose(m(x, causal=True), dense_gated(m, x), atol=1e-12)
    assert m.w_o.last_gate.shape == (2, 7, 16) and m.w_o.x is None


def test_gate_is_a_nonlinearity_and_linear_without_it():
    """Attention output is linear in the values for fixed weights; the gate (a function of x) breaks linearity in x."""
    torch.manual_seed(2)
    m = GatedAttention(cfg(bias=False))
    x = torch.randn(1, 5, 16)
    assert not torch.allclose(m(2 * x, causal=True), 2 * m(x, causal=True), atol=1e-6)


@pytest.mark.parametrize("mixer", ["sigmoid", "gated", ("sigmoid", "gated")])
def test_decoding_with_the_kv_cache_equals_the_full_forward(mixer):
    torch.manual_seed(3)
    model = mixer_lm(cfg(mixer=mixer)).eval()
    ids = torch.randint(0, 11, (2, 12))
    full = model(ids)
    cache = model.decoder.new_cache()
    steps = [model(ids[:, :5], cache=cache)] + [model(ids[:, t:t + 1], cache=cache) for t in range(5, 12)]
    assert torch.allclose(torch.cat(steps, 1), full, atol=1e-12)
    assert type(cache[0]["self"]).__name__ == "KVCache" and len(cache[0]["self"]) == 12
    out, _ = model.generate(ids[:, :4], 5)
    ref, _ = model.generate(ids[:, :4], 5, use_cache=False)
    assert torch.equal(out, ref)


def test_sigmoid_rolling_cache_with_a_window_equals_the_windowed_forward():
    torch.manual_seed(4)
    model = mixer_lm(cfg(mixer="sigmoid", window=4)).eval()
    ids = torch.randint(0, 11, (1, 14))
    full = model(ids)
    cache = model.decoder.new_cache("rolling")
    steps = [model(ids[:, t:t + 1], cache=cache) for t in range(14)]
    assert torch.allclose(torch.cat(steps, 1), full, atol=1e-12)


def test_bad_settings_raise_config_error():
    with pytest.raises(ConfigError, match="positions"):
        SigmoidAttention(cfg(positions="rope"))
    with pytest.raises(ConfigError, match="positions"):
        GatedAttention(cfg(positions="alibi"))
    with pytest.raises(ConfigError, match="tiled"):
        SigmoidAttention(cfg(attn_impl="tiled"))
    with pytest.raises(ConfigError, match="GatedAttention"):
        GatedAttention(cfg()).w_o(torch.randn(1, 2, 16))
