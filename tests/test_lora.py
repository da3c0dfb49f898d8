"""LoRA and NF4 modules of the shared model: exact unit tests and bad-input errors."""

from __future__ import annotations

import pytest
import torch

from proofs.transformer import (DecoderLM, LoRALinear, TransformerConfig, apply_lora, bits_per_parameter,
                                merge_lora, nf4_dequantise, nf4_levels, nf4_quantise, trainable_parameters)


def _lm(seed: int = 0) -> DecoderLM:
    torch.manual_seed(seed)
    return DecoderLM(TransformerConfig(vocab_size=16, d_model=16, n_heads=2, d_ff=32, n_layers=1, dropout_emb=0.0,
                                       dropout_residual=0.0)).eval()


def test_wrapped_layer_starts_equal_and_freezes_the_base():
    base = torch.nn.Linear(8, 6)
    layer = LoRALinear(base, r=2, alpha=4.0)
    x = torch.randn(3, 8)
    assert torch.equal(layer(x), base(x))
    assert not base.weight.requires_grad and not base.bias.requires_grad
    assert layer.A.requires_grad and layer.B.requires_grad and layer.scaling == 2.0


def test_merge_is_the_same_function():
    layer = LoRALinear(torch.nn.Linear(8, 6), r=3, alpha=3.0)
    with torch.no_grad():
        layer.B.normal_()
    x = torch.randn(5, 8)
    merged = layer.merge()
    assert type(merged) is torch.nn.Linear
    torch.testing.assert_close(merged(x), layer(x))


def test_apply_counts_and_merges_a_model():
    model = _lm()
    wrapped = apply_lora(model, ("w_q", "w_v"), r=2, alpha=4.0)
    assert wrapped == ["decoder.layers.0.self_attn.w_q", "decoder.layers.0.self_attn.w_v"]
    assert trainable_parameters(model) == 2 * 2 * (16 + 16)
    ids = torch.randint(0, 16, (2, 5))
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, LoRALinear):
                m.B.normal_()
        before = model(ids)
    merge_lora(model)
    assert not any(isinstance(m, LoRALinear) for m in model.modules())
    torch.testing.assert_close(model(ids), before)


@pytest.mark.parametrize("kwargs, match", [
    ({"r": 0}, "rank"), ({"r": 9}, "rank"), ({"r": 2, "init": "gaussian"}, "init"),
])
def test_bad_lora_settings_raise(kwargs, match):
    with pytest.raises(ValueError, match=match):
        LoRALinear(torch.nn.Linear(8, 6), alpha=1.0, **kwargs)


def test_unknown_targets_name_the_real_layers():
    with pytest.raises(ValueError, match="w_q"):
        apply_lora(_lm(), ("q_proj",))
    with pytest.raises(ValueError, match="q_proj"):  # one real name does not hide a misspelt one
        apply_lora(_lm(), ("w_v", "q_proj"))


def test_split_init_is_exactly_the_base_with_both_factors_nonzero():
    base = torch.nn.Linear(8, 6)
    layer = LoRALinear(base, r=4, alpha=4.0, init="split")
    x = torch.randn(3, 8)
    assert torch.equal(layer(x), base(x)) and torch.equal(layer.delta(), torch.zeros(6, 8))
    assert layer.A.abs().sum() > 0 and layer.B.abs().sum() > 0
    with pytest.raises(ValueError, match="r >= 2"):
        LoRALinear(base, r=1, alpha=1.0, init="split")


def test_nf4_levels():
    levels = nf4_levels()
    assert len(levels) == 16 and torch.all(levels[1:] > levels[:-1])
    assert levels[0] == -1 and levels[-1] == 1 and (levels == 0).sum() == 1
    assert (levels > 0).sum() == 8 and (levels < 0).sum() == 7  # asymmetric: 0 exact


def test_nf4_round_trip_and_bits():
    w = torch.randn(4, 64, dtype=torch.float64)
    codes, absmax = nf4_quantise(w, block=64)
    assert codes.shape == (4, 64) and absmax.shape == (4,) and int(codes.max()) <= 15
    back = nf4_dequantise(codes, absmax, w.shape)
    assert torch.equal(back.abs().amax(1), w.abs().amax(1))  # the block's absmax maps to ±1, a level: exact
    assert torch.equal(nf4_dequantise(*nf4_quantise(back), back.shape), back)  # levels are fixed points
    assert torch.equal(nf4_dequantise(*nf4_quantise(torch.zeros(64)), (64,)), torch.zeros(64, dtype=torch.float64))
    assert bits_per_parameter() == 4.5 and bits_per_parameter(double=True) == 4 + 8 / 64 + 32 / (64 * 256)
    with pytest.raises(ValueError, match="blocks of 64"):
        nf4_quantise(torch.randn(100))


def test_pissa_init_starts_at_the_base_with_ba_nonzero():
    torch.manual_seed(0)
    base = torch.nn.Linear(8, 6)
    w_before = base.weight.detach().clone()
    layer = LoRALinear(base, r=3, alpha=6.0, init="pissa")
    x = torch.randn(5, 8)
    torch.testing.assert_close(layer(x), base(x), rtol=0, atol=1e-5)  # to rounding: W − sBA + sBA
    assert torch.equal(base.weight, w_before)  # the caller's layer is not modified; the wrapper owns the residual
    assert torch.linalg.matrix_norm(layer.B @ layer.A) > 0 and layer.A.abs().sum() > 0 and layer.B.abs().sum() > 0
    U, S, Vh = torch.linalg.svd(w_before, full_matrices=False)
    torch.testing.assert_close(layer.delta(), (U[:, :3] * S[:3]) @ Vh[:3], rtol=0, atol=1e-5)  # the rank-3 part
    torch.testing.assert_close(layer.base.weight + layer.delta(), w_before, rtol=0, atol=1e-6)
    torch.testing.assert_close(layer.merge().weight, w_before, rtol=0, atol=1e-6)
    torch.testing.assert_close(torch.linalg.svdvals(layer.base.weight)[:3], S[3:6], rtol=0, atol=1e-5)  # residual
    with pytest.raises(ValueError, match="rank"):
        LoRALinear(base, r=7, alpha=1.0, init="pissa")  # r > min(d_in, d_out) = 6
