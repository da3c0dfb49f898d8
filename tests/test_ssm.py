"""The selective SSM mixer (proofs/transformer/ssm.py) against references written here: the scan against a sequential
loop, the parallel layer against token-by-token decoding through mixer_lm's caches, the convolution form against the
recurrence; bad settings raise ConfigError."""

import math

import pytest
import torch

from proofs.transformer import ConfigError, KVCache, MixerConfig, mixer_lm, state_bytes
from proofs.transformer.ssm import SelectiveSSM, associative_scan, causal_conv, combine, lti_kernel


def loop(a, b):
    """h_t = a_t h_{t-1} + b_t from h_{-1} = 0, one step at a time along dim 0."""
    h, out = torch.zeros_like(b[0]), []
    for t in range(a.shape[0]):
        h = a[t] * h + b[t]
        out.append(h)
    return torch.stack(out)


def cfg(**kw):
    base = dict(vocab_size=13, d_model=16, n_heads=2, d_ff=32, n_layers=2, mixer="ssm", ssm_state=4, positions="none",
                max_len=64, dropout_emb=0.0, dropout_residual=0.0)
    return MixerConfig(**{**base, **kw})


@pytest.mark.parametrize("T", [1, 2, 3, 7, 8, 33, 256])
def test_scan_equals_loop_and_counts_log_rounds(T):
    g = torch.Generator().manual_seed(T)
    a = torch.rand(T, 3, 5, generator=g, dtype=torch.float64) * 2 - 1  # any sign: the scan needs no decay
    b = torch.randn(T, 3, 5, generator=g, dtype=torch.float64)
    stats = {}
    h = associative_scan(a, b, dim=0, stats=stats)
    assert torch.allclose(h, loop(a, b), rtol=0, atol=1e-12)
    assert stats["rounds"] == math.ceil(math.log2(T)) if T > 1 else stats["rounds"] == 0
    # along another dim: the same numbers
    h1 = associative_scan(a.movedim(0, 1), b.movedim(0, 1), dim=1)
    assert torch.allclose(h1.movedim(1, 0), h, rtol=0, atol=1e-15)


def test_combine_is_associative_exactly_on_integers():
    g = torch.Generator().manual_seed(0)
    p, q, r = [(torch.randint(-4, 5, (50,), generator=g).double(), torch.randint(-4, 5, (50,), generator=g).double())
               for _ in range(3)]
    left, right = combine(combine(p, q), r), combine(p, combine(q, r))
    assert torch.equal(left[0], right[0]) and torch.equal(left[1], right[1])


@pytest.mark.parametrize("selective", [True, False])
@pytest.mark.parametrize("conv", [0, 4])
def test_parallel_equals_recurrent_decoding_through_caches(selective, conv):
    torch.manual_seed(1)
    model = mixer_lm(cfg(ssm_selective=selective, ssm_conv=conv)).double().eval()
    x = torch.randint(0, 13, (3, 17))
    full = model(x)  # parallel: the scan in every layer
    cache = model.decoder.new_cache()
    outs = [model(x[:, :6], cache=cache)]  # a prefill of 6 tokens, then one token at a time
    after_prefill = state_bytes(cache)
    outs += [model(x[:, t:t + 1], cache=cache) for t in range(6, 17)]
    assert torch.allclose(torch.cat(outs, dim=1), full, rtol=0, atol=1e-12)
    assert state_bytes(cache) == after_prefill > 0  # a fixed-size state, whatever the number of tokens
    # generate() drives the mixer through the same caches
    ids, _ = model.generate(x[:, :5], steps=4)
    ids_nocache, _ = model.generate(x[:, :5], steps=4, use_cache=False)
    assert torch.equal(ids, ids_nocache)


def test_layer_recurrent_equals_parallel_and_convolution_when_time_invariant():
    torch.manual_seed(2)
    u = torch.randn(2, 21, 16, dtype=torch.float64)
    sel = SelectiveSSM(cfg()).double()
    lti = SelectiveSSM(cfg(ssm_selective=False)).double()
    for layer in (sel, lti):
        y_rec, _ = layer.recurrent(u, None)
        assert torch.allclose(layer.parallel(u), y_rec, rtol=0, atol=1e-12)
    assert torch.allclose(lti.convolution(u), lti.recurrent(u, None)[0], rtol=0, atol=1e-12)


def test_kernel_and_causal_conv_against_sums_written_here():
    g = torch.Generator().manual_seed(3)
    a, b, c = (torch.rand(4, 3, generator=g, dtype=torch.float64) for _ in range(3))
    K = lti_kernel(a, b, c, 6)
    for k in range(6):
        assert torch.allclose(K[:, k], (c * a**k * b).sum(-1))
    u = torch.randn(2, 6, 4, generator=g, dtype=torch.float64)
    y = causal_conv(u, K)
    ref = torch.stack([sum(K[:, k] * u[:, t - k] for k in range(t + 1)) for t in range(6)], dim=1)
    assert torch.allclose(y, ref, rtol=0, atol=1e-14)


def test_init_keeps_the_s4d_state_matrix_and_scales_w_o():
    torch.manual_seed(4)
    model = mixer_lm(cfg(depth_init="gpt2"))
    layer = model.decoder.layers[0].self_attn
    assert isinstance(layer, SelectiveSSM)
    assert torch.equal(layer.A_log[0], torch.log(torch.arange(1, 5, dtype=torch.float32)))  # not Xavier-overwritten
    bound = math.sqrt(6 / 32) * 4 ** -0.5  # Xavier bound of a 16x16 map x 1/sqrt(2 layers x 2 branches)
    assert layer.w_o.weight.abs().max() <= bound + 1e-6 < math.sqrt(6 / 32)


@pytest.mark.parametrize("bad, match", [
    (dict(ssm_state=0), "ssm_state"),
    (dict(ssm_conv=-1), "ssm_conv"),
    (dict(positions="rope"), "positions"),
    (dict(window=4), "window"),
    (dict(mixer=("ssm",)), "n_layers"),
])
def test_bad_configs_raise(bad, match):
    with pytest.raises(ConfigError, match=match):
        cfg(**bad)


def test_bad_calls_raise():
    c = cfg()
    layer = SelectiveSSM(c)
    x = torch.randn(1, 5, 16)
    with pytest.raises(ConfigError, match="cross-attention"):
        layer(x, x)
    with pytest.raises(ConfigError, match="masks"):
        layer(x, key_padding_mask=torch.zeros(1, 5, dtype=torch.bool))
    with pytest.raises(ConfigError, match="RecurrentState"):
        layer(x, cache=KVCache())
    with pytest.raises(ConfigError, match="d_model"):
        layer(torch.randn(1, 5, 8))
    with pytest.raises(ConfigError, match="no single kernel"):
        layer.convolution(x)
    with pytest.raises(ConfigError, match="MixerConfig"):
        from proofs.transformer import TransformerConfig
        SelectiveSSM(TransformerConfig(vocab_size=13, d_model=16, n_heads=2))
    model = mixer_lm(c)
    cache = model.decoder.new_cache()
    model(torch.randint(0, 13, (1, 4)), cache=cache)
    with pytest.raises(ConfigError, match="roll back"):
        cache[0]["self"].truncate(2)
