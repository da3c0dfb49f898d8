"""ShawAttention against the equations of Shaw et al. (2018), evaluated with explicit loops over b, h, i, j.

    e_ij = q_i · (k_j + a^K_ij) / sqrt(d_k),   α_i = softmax_j(e_ij) over the visible j,
    z_i  = Σ_j α_ij (v_j + a^V_ij),           a^K_ij = w^K[clip(j - i, -k, k) + k] (a^V likewise).
"""

import pytest
import torch

from proofs.measure import LargestTensor
from proofs.transformer import (
    ConfigError,
    DecoderLM,
    EncoderTagger,
    ShawAttention,
    TransformerConfig,
    causal_mask,
    record_attention,
)

CFG = TransformerConfig(d_model=16, n_heads=2, positions="shaw", rel_clip=2, dropout_emb=0.0, dropout_residual=0.0)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def brute_force(attn: ShawAttention, x: torch.Tensor, hide: torch.Tensor | None):
    """Weights (B, nh, T, T) and output (B, T, C) straight from the equations, one (b, h, i, j) at a time."""
    B, T, C = x.shape
    q, k, v = attn.project(x, x)  # (B, nh, T, hs)
    clip = attn.cfg.rel_clip
    w_k = attn.rel_k.expand(attn.n_heads, -1, -1)  # (nh, 2k+1, hs), whether shared or per head
    w_v = None if attn.rel_v is None else attn.rel_v.expand(attn.n_heads, -1, -1)
    weights = torch.zeros(B, attn.n_heads, T, T, dtype=x.dtype)
    z = torch.zeros(B, attn.n_heads, T, attn.d_head, dtype=x.dtype)
    for b in range(B):
        for h in range(attn.n_heads):
            for i in range(T):
                e = []
                for j in range(T):
                    a_k = w_k[h, max(-clip, min(clip, j - i)) + clip]
                    score = torch.dot(q[b, h, i], k[b, h, j] + a_k) / attn.d_head**0.5
                    e.append(float("-inf") if hide is not None and hide[b, i, j] else score)
                alpha = torch.softmax(torch.stack([torch.as_tensor(s, dtype=x.dtype) for s in e]), dim=0)
                weights[b, h, i] = alpha
                for j in range(T):
                    value = v[b, h, j]
                    if w_v is not None:
                        value = value + w_v[h, max(-clip, min(clip, j - i)) + clip]
                    z[b, h, i] += alpha[j] * value
    y = attn.w_o(z.transpose(1, 2).reshape(B, T, C))
    return weights, y


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("length", [3, 5, 9])  # shorter than, equal to and longer than 2k+1 = 5
@pytest.mark.parametrize("on_values", [True, False])
@pytest.mark.parametrize("per_head", [False, True])
@pytest.mark.parametrize("masking", ["none", "causal", "padding"])
def test_shaw_matches_brute_force(dtype, length, on_values, per_head, masking):
    attn = ShawAttention(CFG.replace(rel_on_values=on_values, rel_per_head=per_head)).to(dtype).eval()
    B = 2
    x = torch.randn(B, length, 16, dtype=dtype)
    kw, hide = {}, None
    if masking == "causal":
        kw = {"causal": True}
        hide = causal_mask(length).expand(B, -1, -1)
    elif masking == "padding":
        pad = torch.zeros(B, length, dtype=torch.bool)
        pad[1, length - 2:] = True
        kw = {"key_padding_mask": pad}
        hide = pad[:, None, :].expand(B, length, length)
    with torch.no_grad(), record_attention(attn):
        y = attn(x, **kw)
        w_ref, y_ref = brute_force(attn, x, hide)
        torch.testing.assert_close(attn.weights, w_ref, atol=1e-5, rtol=0)
    torch.testing.assert_close(y, y_ref, atol=1e-5, rtol=0)


def test_per_head_tables_differ_per_head():
    attn = ShawAttention(CFG.replace(rel_per_head=True))
    shared = ShawAttention(CFG)
    assert attn.rel_k.shape == (2, 5, 8) and shared.rel_k.shape == (1, 5, 8)
    assert attn.rel_v.shape == (2, 5, 8)
    assert ShawAttention(CFG.replace(rel_on_values=False)).rel_v is None


def test_tables_do_not_grow_with_length():
    attn = ShawAttention(CFG.replace(rel_clip=3))
    n = sum(p.numel() for p in (attn.rel_k, attn.rel_v))
    assert n == 2 * (2 * 3 + 1) * 8
    for T in (2, 7, 50):  # the same parameters serve every length
        assert attn(torch.randn(1, T, 16)).shape == (1, T, 16)


def test_clip_zero_gives_the_same_position_score_for_every_offset():
    attn = ShawAttention(CFG.replace(rel_clip=0)).eval()
    x = torch.randn(2, 9, 16)
    with torch.no_grad():
        q, k, _ = attn.project(x, x)
        position = attn.score(q, k) - q @ k.transpose(-2, -1) * attn.scale  # (B, nh, T, T): q_i·a^K_ij/√d
    # one table row: q_i·w^K_0 is the same for every key j, so the softmax cannot see it
    torch.testing.assert_close(position, position[..., :1].expand_as(position), atol=1e-6, rtol=0)


def test_relative_index_is_clipped_offset():
    attn = ShawAttention(CFG.replace(rel_clip=2))
    idx = attn.rel_index(4, 4)[0, 0]  # (1, 1, Tq, Tk) -> (Tq, Tk)
    expected = torch.tensor([[2, 3, 4, 4], [1, 2, 3, 4], [0, 1, 2, 3], [0, 0, 1, 2]])  # clip(j - i) + k
    assert torch.equal(idx, expected)
    # fewer queries than keys (a cache): queries are the last positions, as in causal_mask
    assert torch.equal(attn.rel_index(1, 4)[0, 0], torch.tensor([[0, 0, 1, 2]]))


def test_fast_path_is_not_used():
    attn = ShawAttention(CFG.replace(attn_impl="auto")).eval()
    assert not attn.uses_fast_path()
    model = EncoderTagger(CFG.replace(attn_impl="auto"))
    assert all(type(layer.self_attn) is ShawAttention for layer in model.encoder.layers)
    assert not any(layer.self_attn.uses_fast_path() for layer in model.encoder.layers)


def test_negative_clip_is_a_config_error():
    with pytest.raises(ConfigError, match="rel_clip"):
        TransformerConfig(positions="shaw", rel_clip=-1)


def test_no_tensor_of_size_t_t_head_is_built():
    """Forward and backward stay O(T²) per head: nothing of size B·nh·T·T·hs appears."""
    cfg = TransformerConfig(d_model=64, n_heads=2, positions="shaw", rel_clip=4)
    attn = ShawAttention(cfg)
    B, T = 1, 64
    x = torch.randn(B, T, 64, requires_grad=True)
    mode = LargestTensor()
    with mode:
        attn(x, causal=True).sum().backward()
    per_pair = B * cfg.n_heads * T * T  # the score matrix
    assert mode.largest <= per_pair < B * cfg.n_heads * T * T * cfg.d_head // 4


def test_models_train_with_shaw():
    for model in (EncoderTagger(CFG), DecoderLM(CFG.replace(rel_per_head=True))):
        ids = torch.randint(1, 32, (2, 11))
        model(ids).sum().backward()
        attn = model.modules()
        grads = [m.rel_k.grad for m in attn if isinstance(m, ShawAttention)]
        assert grads and all(g is not None and g.abs().sum() > 0 for g in grads)
