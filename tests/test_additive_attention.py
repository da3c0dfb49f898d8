"""AdditiveAttention against the equations of Bahdanau et al. (2015), evaluated with explicit loops over b, h, i, j.

    e_ij = v_h · tanh(q_i + k_j)   (no 1/sqrt(d_k)),   α_i = softmax_j(e_ij) over the visible j,   z_i = Σ_j α_ij v_j,

with q = W_1 x (w_q), k = W_2 x (w_k), v_j = W_V x_j, split into heads. The reference takes the
projection weights straight from the Linear layers and never calls the module's `score`.
"""

import pytest
import torch

from proofs.measure import LargestTensor
from proofs.transformer import (
    AdditiveAttention,
    ConfigError,
    DecoderLM,
    EncoderDecoder,
    EncoderTagger,
    MultiHeadAttention,
    TransformerConfig,
    causal_mask,
    make_self_attention,
    record_attention,
)

ATOL = 1e-5
CFG = TransformerConfig(d_model=16, n_heads=2, d_ff=32, score_fn="additive", dropout_emb=0.0, dropout_residual=0.0)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def additive_head(cfg=CFG) -> AdditiveAttention:
    attn = AdditiveAttention(cfg).eval()
    with torch.no_grad():  # a trained-looking v, so that scores are far from 0 and differ per head
        attn.v.normal_()
    return attn


def brute_force(attn: AdditiveAttention, x: torch.Tensor, kv: torch.Tensor, hide: torch.Tensor | None):
    """Weights (B, nh, Tq, Tk) and output (B, Tq, C) from the equations, one (b, h, i, j) at a time."""
    B, Tq, C = x.shape
    Tk = kv.shape[1]
    nh, hs = attn.n_heads, attn.d_head
    q = attn.w_q(x).view(B, Tq, nh, hs)  # W_1 x_i
    k = attn.w_k(kv).view(B, Tk, nh, hs)  # W_2 x_j
    val = attn.w_v(kv).view(B, Tk, nh, hs)
    weights = torch.zeros(B, nh, Tq, Tk, dtype=x.dtype)
    z = torch.zeros(B, Tq, nh, hs, dtype=x.dtype)
    for b in range(B):
        for h in range(nh):
            for i in range(Tq):
                e = torch.stack([
                    torch.tensor(float("-inf"), dtype=x.dtype) if hide is not None and hide[b, i, j]
                    else torch.dot(attn.v[h], torch.tanh(q[b, i, h] + k[b, j, h]))
                    for j in range(Tk)
                ])
                alpha = torch.softmax(e, dim=0)
                weights[b, h, i] = alpha
                for j in range(Tk):
                    z[b, i, h] += alpha[j] * val[b, j, h]
    return weights, attn.w_o(z.reshape(B, Tq, C))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("masking", ["none", "causal", "padding", "attn_mask"])
@pytest.mark.parametrize("lengths", [(5, 5), (3, 7)])  # self-attention shape and cross-attention shape
def test_additive_matches_brute_force(dtype, masking, lengths):
    attn = additive_head().to(dtype)
    B, (Tq, Tk) = 2, lengths
    x, kv = torch.randn(B, Tq, 16, dtype=dtype), torch.randn(B, Tk, 16, dtype=dtype)
    kw, hide = {}, None
    if masking == "causal":
        kw = {"causal": True}
        hide = causal_mask(Tq, Tk).expand(B, -1, -1)
    elif masking == "padding":
        pad = torch.zeros(B, Tk, dtype=torch.bool)
        pad[1, Tk - 2:] = True
        kw = {"key_padding_mask": pad}
        hide = pad[:, None, :].expand(B, Tq, Tk)
    elif masking == "attn_mask":
        hide = torch.rand(B, Tq, Tk) < 0.3
        hide[:, :, 0] = False  # every query keeps one key
        kw = {"attn_mask": hide}
    with torch.no_grad(), record_attention(attn):
        y = attn(x, kv, **kw)
        w_ref, y_ref = brute_force(attn, x, kv, hide)
        torch.testing.assert_close(attn.weights, w_ref, atol=ATOL, rtol=0)
    torch.testing.assert_close(y, y_ref, atol=ATOL, rtol=0)
    if hide is not None:  # hidden keys get exactly zero weight
        assert attn.weights.masked_select(hide[:, None].expand_as(attn.weights)).abs().max() == 0


def test_mask_fill_min_matches_minus_inf():
    attn = additive_head()
    other = additive_head(CFG.replace(mask_fill="min"))
    other.load_state_dict(attn.state_dict())
    x = torch.randn(2, 6, 16)
    with torch.no_grad():
        torch.testing.assert_close(attn(x, causal=True), other(x, causal=True), atol=ATOL, rtol=0)


def test_scores_ignore_the_scale_and_are_bounded_by_v_l1():
    attn = additive_head()
    x = torch.randn(4, 9, 16) * 100  # huge inputs: every tanh saturates
    with torch.no_grad():
        q, k, _ = attn.project(x, x)
        s = attn.score(q, k)  # (B, nh, T, T)
        bound = attn.v.abs().sum(-1)[None, :, None, None]  # ||v_h||_1 per head
        assert (s.abs() <= bound + 1e-5).all()
        # the bound is tight: q_i + k_j = 100·sign(v_h) saturates every tanh with v_h's signs
        q_top = 100 * attn.v.sign()[None, :, None, :].expand(1, 2, 3, 8)
        torch.testing.assert_close(attn.score(q_top, torch.zeros(1, 2, 4, 8)), bound[:1].expand(1, 2, 3, 4))
        unscaled = torch.einsum("hd,bhijd->bhij", attn.v, torch.tanh(q[:, :, :, None] + k[:, :, None]))
        torch.testing.assert_close(s, unscaled, atol=1e-4, rtol=0)  # no 1/sqrt(d_k) anywhere


def test_fast_path_is_not_used():
    attn = additive_head(CFG.replace(attn_impl="auto"))
    assert not attn.uses_fast_path()
    assert MultiHeadAttention(CFG.replace(score_fn="dot")).uses_fast_path()  # the same config, dot: fast path


def test_models_use_additive_scores_everywhere():
    model = EncoderDecoder(CFG)
    attns = [m for m in model.modules() if isinstance(m, MultiHeadAttention)]
    assert len(attns) == 2 + 2 + 2  # encoder self, decoder self, decoder cross
    assert all(type(m) is AdditiveAttention for m in attns)
    assert all(type(layer.cross_attn) is AdditiveAttention for layer in model.decoder.layers)
    dot = EncoderDecoder(CFG.replace(score_fn="dot"))
    assert all(type(m) is MultiHeadAttention for m in dot.modules() if isinstance(m, MultiHeadAttention))
    assert type(make_self_attention(CFG)) is AdditiveAttention


def test_models_train_with_additive_scores():
    for model in (EncoderTagger(CFG), DecoderLM(CFG), EncoderDecoder(CFG)):
        ids = torch.randint(1, 32, (2, 7))
        out = model(ids, ids[:, :5]) if isinstance(model, EncoderDecoder) else model(ids)
        out.sum().backward()
        grads = [m.v.grad for m in model.modules() if isinstance(m, AdditiveAttention)]
        assert grads and all(g is not None and g.abs().sum() > 0 for g in grads)


def test_one_vector_v_per_head_is_the_only_new_parameter():
    attn = AdditiveAttention(CFG)
    dot = MultiHeadAttention(CFG.replace(score_fn="dot"))
    extra = {n for n, _ in attn.named_parameters()} - {n for n, _ in dot.named_parameters()}
    assert extra == {"v"} and attn.v.shape == (2, 8)


def test_additive_materialises_a_pair_by_channel_tensor():
    """The documented cost: a (B, nh, Tq, Tk, hs) tensor, hs times the dot-product score matrix."""
    B, T = 2, 12
    sizes = {}
    for fn in ("dot", "additive"):
        attn = make_self_attention(CFG.replace(score_fn=fn, attn_impl="explicit"))
        mode = LargestTensor()
        with mode:
            attn(torch.randn(B, T, 16))
        sizes[fn] = mode.largest
    assert sizes["additive"] == B * 2 * T * T * 8
    assert sizes["dot"] == B * 2 * T * T


@pytest.mark.parametrize("overrides,match", [
    ({"positions": "shaw"}, r"positions='shaw' each change the attention score.*score_fn='dot'"),
    ({"positions": "xl"}, r"positions='xl' each change the attention score"),
    ({"qk_norm": "layer"}, r"Set qk_norm='none'"),
    ({"attn_scale": "none"}, r"attn_scale='none' scales q·k.*Leave attn_scale='sqrt_dk'"),
    ({"attn_scale": "dk"}, r"attn_scale='dk'"),
    ({"score_fn": "bahdanau"}, r"score_fn='bahdanau' is not an option; use one of 'dot', 'additive'"),
])
def test_meaningless_combinations_are_config_errors(overrides, match):
    with pytest.raises(ConfigError, match=match):
        CFG.replace(**overrides)


def test_dot_keeps_every_switch():
    for overrides in ({"positions": "shaw"}, {"positions": "xl"}, {"qk_norm": "layer"}, {"attn_scale": "none"}):
        CFG.replace(score_fn="dot", **overrides)  # no error: only the additive combinations are refused
