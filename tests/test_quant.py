"""proofs/transformer/quant.py: exact checks of the quantiser, the W8A8 emulation and the model helper."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from proofs.transformer import DecoderLM, Int8Linear, TransformerConfig, dequantise, fake_quantise, int8_matmul
from proofs.transformer import quantise, quantise_model
from proofs.transformer.quant import elementwise_scale, qmax

CASES = [("per_tensor", None), ("per_channel", None), ("per_group", 8), ("per_group", 24)]


def weight(seed: int = 0, shape=(16, 48)) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def test_qmax():
    assert qmax(8) == 127 and qmax(4) == 7


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("granularity,group", CASES)
def test_round_trip_error_at_most_half_a_scale(bits, granularity, group):
    w = weight()
    q = quantise(w, bits, granularity, group)
    err = (dequantise(q) - w).abs()
    assert (err <= elementwise_scale(q) / 2 * (1 + 1e-12)).all()


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("granularity,group", CASES)
def test_codes_are_integers_in_range_and_absmax_hits_the_top_level(bits, granularity, group):
    w = weight(1)
    q = quantise(w, bits, granularity, group)
    assert q.codes.dtype == torch.int8
    assert int(q.codes.abs().max()) == qmax(bits)  # every block's absmax maps to ±qmax exactly
    assert int(q.codes.min()) >= -qmax(bits) and int(q.codes.max()) <= qmax(bits)


def test_scales_per_granularity_have_the_stated_shapes_and_values():
    w = weight(2)
    assert quantise(w, 8, "per_tensor").scale.shape == ()
    pc = quantise(w, 8, "per_channel")
    assert pc.scale.shape == (16, 1)
    assert torch.equal(pc.scale.squeeze(1), w.abs().amax(1) / 127)
    pg = quantise(w, 4, "per_group", 8)
    assert pg.scale.shape == (16, 6, 1) and pg.codes.shape == (16, 6, 8)
    assert torch.equal(pg.scale.squeeze(-1), w.reshape(16, 6, 8).abs().amax(-1) / 7)
    assert dequantise(pg).shape == w.shape


def test_finer_granularity_never_has_a_larger_scale():
    w = weight(3)
    s_t, s_c, s_g = (elementwise_scale(quantise(w, 8, g, gs)) for g, gs in CASES[:3])
    assert (s_g <= s_c).all() and (s_c <= s_t).all()


def test_per_group_of_the_whole_row_equals_per_channel():
    w = weight(4)
    assert torch.equal(fake_quantise(w, 4, "per_group", 48), fake_quantise(w, 4, "per_channel"))


def test_zero_block_round_trips_to_zero():
    w = torch.zeros(4, 8)
    for g, gs in CASES[:3]:
        assert torch.equal(fake_quantise(w, 8, g, gs), w)


@pytest.mark.parametrize("kwargs,match", [
    (dict(bits=3), "bits=3"),
    (dict(granularity="per_row"), "granularity"),
    (dict(granularity="per_group", group_size=5), "does not divide"),
    (dict(granularity="per_group"), "positive group_size"),
    (dict(granularity="per_channel", group_size=8), "only meaningful"),
])
def test_bad_arguments_raise(kwargs, match):
    with pytest.raises(ValueError, match=match):
        quantise(weight(), **kwargs)


def test_per_channel_needs_a_matrix():
    with pytest.raises(ValueError, match="2-D"):
        quantise(torch.randn(2, 3, 4), 8, "per_channel")
    assert fake_quantise(torch.randn(2, 3, 4), 8, "per_tensor").shape == (2, 3, 4)


def test_int8_matmul_is_exact_on_integer_grids():
    """Inputs already on the int8 grid (scale 1: absmax 127 in every row / column) multiply exactly."""
    g = torch.Generator().manual_seed(5)
    x = torch.randint(-127, 128, (6, 32), generator=g).double()
    w = torch.randint(-127, 128, (5, 32), generator=g).double()
    x[:, 0], w[:, 0] = 127, 127  # absmax 127 per row of x and per row of w: scales are exactly 1
    for act in ("per_tensor", "per_token"):
        assert torch.equal(int8_matmul(x, w, act), x @ w.T)


def test_int8_matmul_shapes_errors_and_full_decomposition():
    x, w = torch.randn(2, 3, 8), torch.randn(4, 8)
    assert int8_matmul(x, w).shape == (2, 3, 4)
    # threshold 0: every column is an outlier, so the product is the float one
    assert torch.allclose(int8_matmul(x, w, threshold=0.0), x @ w.T, atol=1e-6)
    with pytest.raises(ValueError, match="do not match"):
        int8_matmul(x, torch.randn(4, 7))
    with pytest.raises(ValueError, match="act="):
        int8_matmul(x, w, act="per_channel")


def test_decomposition_keeps_outlier_column_exact():
    """A column above the threshold leaves the int8 part: the result equals the int8 product of the other
    columns plus the float product of that column."""
    g = torch.Generator().manual_seed(6)
    x, w = torch.randn(10, 16, generator=g, dtype=torch.float64), torch.randn(3, 16, generator=g, dtype=torch.float64)
    x[:, 4] *= 40
    mixed = int8_matmul(x, w, "per_token", threshold=6.0)
    keep = torch.ones(16, dtype=torch.bool)
    keep[4] = False
    expected = int8_matmul(x[:, keep], w[:, keep], "per_token") + x[:, ~keep] @ w[:, ~keep].T
    assert torch.allclose(mixed, expected, rtol=0, atol=1e-12)


def tiny_lm() -> DecoderLM:
    torch.manual_seed(0)
    return DecoderLM(TransformerConfig(vocab_size=16, d_model=32, n_heads=4, d_ff=64, n_layers=1,
                                       tie_embeddings="none", dropout_emb=0.0, dropout_residual=0.0)).eval()


def test_quantise_model_copies_and_replaces_every_linear():
    model = tiny_lm()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    q = quantise_model(model, 4, "per_group", 16)
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())  # original untouched
    for name, mod in q.named_modules():
        if isinstance(mod, nn.Linear):
            orig = dict(model.named_modules())[name].weight
            assert torch.equal(mod.weight, fake_quantise(orig, 4, "per_group", 16))
    w8a8 = quantise_model(model, activations="per_token")
    n_lin = sum(isinstance(m, nn.Linear) for m in model.modules())
    assert sum(isinstance(m, Int8Linear) for m in w8a8.modules()) == n_lin > 0
    ids = torch.randint(1, 16, (2, 5))
    assert w8a8(ids).shape == model(ids).shape


@pytest.mark.parametrize("kwargs,match", [
    (dict(threshold=6.0), "threshold applies"),
    (dict(bits=4, activations="per_token"), "int8 with per-channel"),
    (dict(bits=5), "bits=5"),
])
def test_quantise_model_errors(kwargs, match):
    with pytest.raises(ValueError, match=match):
        quantise_model(tiny_lm(), **kwargs)


def test_smoothing_factors_formula_equivalence_and_balance():
    """s_j = max|X_j|^a / max|W_j|^(1-a); x Wᵀ = (x / s)(W s)ᵀ; after smoothing with a = 0.5 the activation and
    weight maxima of each channel are equal (both sqrt(max|X_j| max|W_j|))."""
    from proofs.transformer.quant import smoothing_factors
    g = torch.Generator().manual_seed(7)
    x, w = torch.randn(20, 8, generator=g, dtype=torch.float64), torch.randn(5, 8, generator=g, dtype=torch.float64)
    x[:, 3] *= 50
    a, b = x.abs().amax(0), w.abs().amax(0)
    s = smoothing_factors(a, b, 0.5)
    assert torch.allclose(s, a.sqrt() / b.sqrt(), rtol=1e-15, atol=0)
    assert torch.allclose((x / s) @ (w * s).T, x @ w.T, rtol=1e-12, atol=1e-12)
    assert torch.allclose((x / s).abs().amax(0), (w * s).abs().amax(0), rtol=1e-12)
    assert torch.equal(smoothing_factors(a, b, 1.0), a) and torch.equal(smoothing_factors(a, b, 0.0), 1 / b)
    a[0], b[1] = 0.0, 0.0  # an all-zero feature or column is left alone
    assert smoothing_factors(a, b)[0] == 1 and smoothing_factors(a, b)[1] == 1


@pytest.mark.parametrize("args,match", [
    ((torch.ones(3), torch.ones(4)), "same 1-D shape"),
    ((torch.ones(3), torch.ones(3), 1.5), "alpha"),
    ((-torch.ones(3), torch.ones(3)), "negative"),
])
def test_smoothing_factors_errors(args, match):
    from proofs.transformer.quant import smoothing_factors
    with pytest.raises(ValueError, match=match):
        smoothing_factors(*args)
