"""The modern block's switches against independent references: torch.nn.RMSNorm, the activation formulas,
a hand-written GLU, a hand-composed parallel layer, GPT-2 and DeepNorm initialisation against the unscaled
model, DeepNet's table of constants, and the ConfigErrors that name the fix."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from proofs.transformer import (ConfigError, DecoderLM, EncoderDecoder, EncoderTagger, FeedForward, MultiHeadAttention,
                                RMSNorm, TransformerConfig)
from proofs.transformer.layers import DecoderLayer, EncoderLayer, Residual
from proofs.transformer.models import deepnorm_constants


def cfg(**switches) -> TransformerConfig:
    base = dict(vocab_size=20, d_model=24, n_heads=4, d_ff=40, n_layers=3, dropout_emb=0.0, dropout_residual=0.0)
    return TransformerConfig(**{**base, **switches})


# --- RMSNorm ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("eps", [1e-5, 1e-6, 0.1])
@pytest.mark.parametrize("shape", [(3, 7, 24), (5, 64), (2, 2, 3, 16)])
def test_rmsnorm_matches_torch_nn_rmsnorm(eps, shape):
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(shape, generator=g) * 3 + 1, torch.randn(shape[-1], generator=g)
    ours, ref = RMSNorm(shape[-1], eps), nn.RMSNorm(shape[-1], eps=eps)
    with torch.no_grad():
        ours.weight.copy_(w), ref.weight.copy_(w)
    torch.testing.assert_close(ours(x), ref(x))
    torch.testing.assert_close(ours(x), F.rms_norm(x, (shape[-1],), w, eps))
    assert [n for n, _ in ours.named_parameters()] == ["weight"]  # a gain, no bias


def test_norm_switch_builds_rmsnorm_everywhere():
    model = DecoderLM(cfg(norm="rms", norm_position="pre"))
    norms = [m for m in model.modules() if isinstance(m, (nn.LayerNorm, RMSNorm))]
    assert norms and all(isinstance(m, RMSNorm) for m in norms)
    assert len(norms) == 2 * 3 + 1  # two per layer and the final one


def test_qk_rms_norm_matches_a_hand_computation():
    torch.manual_seed(0)
    attn = MultiHeadAttention(cfg(qk_norm="rms")).eval()
    with torch.no_grad():
        attn.q_norm.weight.copy_(torch.randn(6)), attn.k_norm.weight.copy_(torch.randn(6))
    x = torch.randn(2, 5, 24)
    B, T, nh, hs = 2, 5, 4, 6

    def heads(t):
        return t.view(B, T, nh, hs).transpose(1, 2)

    q = F.rms_norm(heads(attn.w_q(x)), (hs,), attn.q_norm.weight, 1e-5)
    k = F.rms_norm(heads(attn.w_k(x)), (hs,), attn.k_norm.weight, 1e-5)
    y = F.scaled_dot_product_attention(q, k, heads(attn.w_v(x)), is_causal=True)
    torch.testing.assert_close(attn(x, causal=True), attn.w_o(y.transpose(1, 2).reshape(B, T, 24)))


# --- activations and the gated FFN ------------------------------------------------------------------------

FORMULAS = {
    "relu": lambda x: x.clamp_min(0),
    "gelu": lambda x: x * 0.5 * (1 + torch.erf(x / math.sqrt(2))),
    "gelu_tanh": lambda x: 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3))),
    "silu": lambda x: x / (1 + torch.exp(-x)),
}


@pytest.mark.parametrize("activation", sorted(FORMULAS))
@pytest.mark.parametrize("gated", [False, True])
def test_ffn_matches_the_formula(activation, gated):
    torch.manual_seed(1)
    ffn = FeedForward(cfg(activation=activation, ffn_gated=gated))
    x = torch.randn(3, 4, 24, dtype=torch.float64)
    ffn = ffn.double()
    h = FORMULAS[activation](x @ ffn.lin1.weight.T + ffn.lin1.bias)
    if gated:  # GLU family: act(x W + b) ⊙ (x V + c), then W2 (Shazeer 2020, eqs. 5-6 with biases)
        h = h * (x @ ffn.gate.weight.T + ffn.gate.bias)
    torch.testing.assert_close(ffn(x), h @ ffn.lin2.weight.T + ffn.lin2.bias)
    assert (ffn.gate is not None) == gated


def test_swiglu_without_biases_has_three_matrices():
    ffn = FeedForward(cfg(ffn_gated=True, activation="silu", bias=False))
    assert sorted(n for n, _ in ffn.named_parameters()) == ["gate.weight", "lin1.weight", "lin2.weight"]


# --- the parallel block ---------------------------------------------------------------------------------

def test_parallel_decoder_layer_is_x_plus_attn_plus_ffn_of_one_norm():
    torch.manual_seed(2)
    layer = DecoderLayer(cfg(norm_position="pre", parallel_block=True), cross=False).eval()
    x = torch.randn(2, 6, 24)
    h = layer.sub_self.norm(x)
    expected = x + layer.self_attn(h, causal=True) + layer.ffn(h)
    torch.testing.assert_close(layer(x), expected)
    assert layer.sub_ffn is None  # one norm per layer


def test_parallel_encoder_layer_is_x_plus_attn_plus_ffn_of_one_norm():
    torch.manual_seed(3)
    layer = EncoderLayer(cfg(norm_position="pre", parallel_block=True, norm="rms")).eval()
    x = torch.randn(2, 6, 24)
    h = layer.sub_attn.norm(x)
    torch.testing.assert_close(layer(x), x + layer.self_attn(h) + layer.ffn(h))


def test_sequential_and_parallel_share_every_weight_matrix():
    seq = DecoderLM(cfg(norm_position="pre"))
    par = DecoderLM(cfg(norm_position="pre", parallel_block=True))
    shapes = lambda m: sorted((n, tuple(p.shape)) for n, p in m.named_parameters() if "norm" not in n)  # noqa: E731
    assert shapes(seq) == shapes(par)


def test_parallel_block_needs_pre_ln_and_no_cross_attention():
    with pytest.raises(ConfigError, match="Set norm_position='pre'"):
        cfg(parallel_block=True)
    with pytest.raises(ConfigError, match="Use DecoderLM or set parallel_block=False"):
        EncoderDecoder(cfg(parallel_block=True, norm_position="pre"))


# --- GPT-2 and DeepNorm initialisation ---------------------------------------------------------------------

def _twins(model_cls, **switches):
    """The same seed with depth_init='none' and with the switches: identical draws, then the scalings."""
    torch.manual_seed(4)
    plain = model_cls(cfg(**{k: v for k, v in switches.items() if k != "depth_init"}))
    torch.manual_seed(4)
    return dict(plain.named_parameters()), dict(model_cls(cfg(**switches)).named_parameters())


@pytest.mark.parametrize("model_cls,branches", [(DecoderLM, 2 * 3), (EncoderTagger, 2 * 3), (EncoderDecoder, None)])
def test_gpt2_init_scales_exactly_the_residual_output_projections(model_cls, branches):
    plain, scaled = _twins(model_cls, depth_init="gpt2", norm_position="pre")
    for name, p in scaled.items():
        out_proj = name.endswith("w_o.weight") or name.endswith("lin2.weight")
        if branches is None:  # encoder: 2 branches per layer; decoder with cross-attention: 3
            n = 3 * 3 if name.startswith("decoder.") else 2 * 3
        else:
            n = branches
        factor = n ** -0.5 if out_proj else 1.0
        torch.testing.assert_close(p, plain[name] * factor, rtol=0, atol=1e-7, msg=name)


@pytest.mark.parametrize("model_cls", [DecoderLM, EncoderTagger, EncoderDecoder])
def test_deepnorm_init_scales_v_o_and_ffn_by_beta(model_cls):
    plain, scaled = _twins(model_cls, depth_init="deepnorm", ffn_gated=True)
    torch.manual_seed(4)
    model = model_cls(cfg(depth_init="deepnorm", ffn_gated=True))
    betas = {id(p): stack.beta for stack in model.modules() if hasattr(stack, "beta") for p in stack.parameters()}
    params = dict(model.named_parameters())
    for name, p in scaled.items():
        beta_scaled = p.dim() == 2 and any(k in name for k in ("w_v.", "w_o.", "lin1.", "lin2.", "gate."))
        factor = betas[id(params[name])] if beta_scaled else 1.0
        torch.testing.assert_close(p, plain[name] * factor, rtol=0, atol=1e-7, msg=name)


def test_deepnorm_constants_follow_the_deepnet_table():
    # Wang et al. 2022 (DeepNet), the table of alpha and beta: N encoder layers, M decoder layers
    for n in (6, 18, 100):
        assert deepnorm_constants(n, 0, "single") == pytest.approx(((2 * n) ** 0.25, (8 * n) ** -0.25))
    for n, m in ((6, 6), (18, 18), (100, 20)):
        enc = (0.81 * (n**4 * m) ** (1 / 16), 0.87 * (n**4 * m) ** (-1 / 16))
        dec = ((3 * m) ** 0.25, (12 * m) ** -0.25)
        assert deepnorm_constants(n, m, "encoder") == pytest.approx(enc)
        assert deepnorm_constants(n, m, "decoder") == pytest.approx(dec)
    assert deepnorm_constants(18, 18, "encoder")[0] == pytest.approx(2.0, abs=0.01)  # hand value: 0.81·18^(5/16)


def test_deepnorm_stacks_get_their_role_constants():
    model = EncoderDecoder(cfg(depth_init="deepnorm", n_layers=4, n_dec_layers=2))
    assert (model.encoder.alpha, model.encoder.beta) == pytest.approx(deepnorm_constants(4, 2, "encoder"))
    assert (model.decoder.alpha, model.decoder.beta) == pytest.approx(deepnorm_constants(4, 2, "decoder"))
    lm = DecoderLM(cfg(depth_init="deepnorm", n_layers=5))
    assert (lm.decoder.alpha, lm.decoder.beta) == pytest.approx(((2 * 5) ** 0.25, (8 * 5) ** -0.25))


def test_deepnorm_residual_is_norm_of_alpha_x_plus_f():
    torch.manual_seed(5)
    res = Residual(cfg(depth_init="deepnorm"), alpha=2.5).eval()
    x, f = torch.randn(2, 3, 24), nn.Linear(24, 24)
    torch.testing.assert_close(res(x, f), F.layer_norm(2.5 * x + f(x), (24,), res.norm.weight, res.norm.bias))


def test_deepnorm_needs_post_ln():
    with pytest.raises(ConfigError, match="for Pre-LN use depth_init='gpt2'"):
        cfg(depth_init="deepnorm", norm_position="pre")
    with pytest.raises(ConfigError, match="residual=True"):
        cfg(depth_init="deepnorm", residual=False)
