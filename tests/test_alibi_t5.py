"""ALiBi and T5's relative bias in the shared model against independent formulas.

- ALiBi slopes: the `get_slopes` of Press et al.'s code (recursive for a head count that is not a power of
  two), rewritten here; the paper's two worked examples (8 heads: 1/2 ... 1/256; 16 heads: 2^-0.5 ... 2^-8);
- the ALiBi bias -m_h·(i - j) and attention with it, as a brute-force loop over (b, h, i, j);
- T5's buckets: the `_relative_position_bucket` of the T5 code, written out with Python's math.log one
  offset at a time; attention with one learned scalar per head and bucket, as a loop;
- both biases on the three attention paths (fused SDPA with a float mask, explicit, tiled): same outputs
  and, for T5's learned table, the same gradients.
"""

import math

import pytest
import torch
import torch.nn.functional as F

from proofs.transformer import (
    ALiBiAttention,
    ConfigError,
    DecoderLM,
    EncoderTagger,
    T5BiasAttention,
    TransformerConfig,
    alibi_slopes,
    t5_bucket,
)

CFG = TransformerConfig(d_model=32, n_heads=4, dropout_emb=0.0, dropout_residual=0.0)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


# --- ALiBi ------------------------------------------------------------------------------------

def press_get_slopes(n):
    """attention_with_linear_biases/fairseq/models/transformer.py, get_slopes."""
    def power_of_2(n):
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        return [start * start**i for i in range(n)]

    if math.log2(n).is_integer():
        return power_of_2(n)
    closest = 2 ** math.floor(math.log2(n))
    return power_of_2(closest) + press_get_slopes(2 * closest)[0::2][: n - closest]


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 6, 7, 8, 12, 16, 20, 24, 32, 40, 64, 96])
def test_slopes_are_press_et_al(n):
    assert alibi_slopes(n).tolist() == pytest.approx(press_get_slopes(n), rel=1e-6)


def test_slopes_worked_examples_of_the_paper():
    """§3: 8 heads -> 1/2^1 ... 1/2^8; 16 heads -> the sequence that starts at 1/sqrt(2) with ratio 1/sqrt(2)."""
    assert alibi_slopes(8).tolist() == pytest.approx([2.0**-k for k in range(1, 9)], rel=1e-7)
    assert alibi_slopes(16).tolist() == pytest.approx([2.0 ** (-k / 2) for k in range(1, 17)], rel=1e-6)


def alibi_brute(attn, x, causal):
    B, T, C = x.shape
    q, k, v = attn.project(x, x)
    m = press_get_slopes(attn.n_heads)
    z = torch.zeros(B, attn.n_heads, T, attn.d_head, dtype=x.dtype)
    for b in range(B):
        for h in range(attn.n_heads):
            for i in range(T):
                keys = [j for j in range(T) if not (causal and j > i)]
                e = torch.stack([torch.dot(q[b, h, i], k[b, h, j]) / math.sqrt(attn.d_head) - m[h] * abs(i - j)
                                 for j in keys])
                for w, j in zip(torch.softmax(e, 0), keys):
                    z[b, h, i] += w * v[b, h, j]
    return attn.w_o(z.transpose(1, 2).reshape(B, T, C))


@pytest.mark.parametrize("n_heads", [4, 2])
@pytest.mark.parametrize("impl", ["auto", "explicit", "tiled"])
@pytest.mark.parametrize("causal", [True, False])
def test_alibi_attention_matches_brute_force(n_heads, impl, causal):
    attn = ALiBiAttention(CFG.replace(positions="alibi", n_heads=n_heads, attn_impl=impl, attn_block=3)).double()
    x = torch.randn(2, 7, 32, dtype=torch.float64)
    assert torch.allclose(attn.eval()(x, causal=causal), alibi_brute(attn, x, causal), atol=1e-10)


def test_alibi_bias_values_and_fast_path():
    attn = ALiBiAttention(CFG.replace(positions="alibi"))
    pos = torch.arange(6)[None]
    b = attn.bias(pos, pos)[0]  # (nh, T, T)
    m = press_get_slopes(4)
    for h in range(4):
        for i in range(6):
            for j in range(6):
                assert b[h, i, j].item() == pytest.approx(-m[h] * abs(i - j), abs=1e-7)
    assert attn.uses_fast_path()


def test_alibi_model_has_no_position_parameters_or_tables():
    lm = DecoderLM(CFG.replace(positions="alibi"))
    names = [n for n, _ in lm.named_parameters()] + [n for n, _ in lm.named_buffers()]
    assert lm.embed.pos is None and not hasattr(lm.embed, "pe")
    assert [n for n in names if "pos" in n or "pe" == n.split(".")[-1]] == []


def test_alibi_with_cache_and_positions_equals_full_pass():
    lm = DecoderLM(CFG.replace(positions="alibi", n_layers=2, vocab_size=20)).eval()
    ids = torch.randint(1, 20, (2, 8))
    cache = lm.decoder.new_cache()
    steps = torch.cat([lm(ids[:, t:t + 1], cache=cache) for t in range(8)], dim=1)
    assert (steps - lm(ids)).abs().max() < 1e-5


# --- T5 ---------------------------------------------------------------------------------------

def t5_reference(rel, bidirectional, num_buckets, max_distance):
    """The T5 code's _relative_position_bucket for ONE offset rel = key - query, in plain Python (float32 log as
    in the original, via torch on a scalar, so bucket edges round the same way)."""
    ret = 0
    n = -rel
    if bidirectional:
        num_buckets //= 2
        ret += (n < 0) * num_buckets
        n = abs(n)
    else:
        n = max(n, 0)
    max_exact = num_buckets // 2
    if n < max_exact:
        return ret + n
    val = max_exact + int(torch.log(torch.tensor(n / max_exact, dtype=torch.float32)).item()
                          / math.log(max_distance / max_exact) * (num_buckets - max_exact))
    return ret + min(val, num_buckets - 1)


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize("buckets,max_distance", [(32, 128), (16, 16), (8, 20), (4, 8)])
def test_buckets_are_the_t5_code(bidirectional, buckets, max_distance):
    offsets = torch.arange(-300, 301)
    got = t5_bucket(offsets, bidirectional, buckets, max_distance).tolist()
    want = [t5_reference(o, bidirectional, buckets, max_distance) for o in offsets.tolist()]
    assert got == want


def test_bucket_layout_of_the_paper():
    """32 buckets, offsets up to 128 (Raffel et al. 2020, §2.1), causal: 0..15 exact, then log-spaced, 128+ last."""
    back = -torch.arange(0, 2000)
    b = t5_bucket(back, False, 32, 128)
    assert b[:16].tolist() == list(range(16))
    assert b[16] == 16 and b[112] == 30 and (b[113:] == 31).all()  # the last bucket: 113 and beyond
    assert (b[1:] >= b[:-1]).all()  # never decreases with distance
    assert (t5_bucket(torch.arange(1, 50), False, 32, 128) == 0).all()  # causal: keys after the query -> bucket 0


def test_bucket_arguments_that_divide_by_zero_are_refused():
    with pytest.raises(ConfigError, match="t5_max_distance"):
        TransformerConfig(positions="t5", t5_buckets=16, t5_max_distance=8)
    with pytest.raises(ConfigError, match="t5_buckets"):
        TransformerConfig(positions="t5", t5_buckets=2, t5_max_distance=8)
    with pytest.raises(ValueError):
        t5_bucket(torch.arange(-5, 5), False, 16, 8)


def t5_brute(attn, x, causal):
    B, T, C = x.shape
    q, k, v = attn.project(x, x)
    n_b, max_d = attn.cfg.t5_buckets, attn.cfg.t5_max_distance
    z = torch.zeros(B, attn.n_heads, T, attn.d_head, dtype=x.dtype)
    for b in range(B):
        for h in range(attn.n_heads):
            for i in range(T):
                keys = [j for j in range(T) if not (causal and j > i)]
                e = torch.stack([torch.dot(q[b, h, i], k[b, h, j]) / math.sqrt(attn.d_head)
                                 + attn.rel_bias[t5_reference(j - i, not causal, n_b, max_d), h] for j in keys])
                for w, j in zip(torch.softmax(e, 0), keys):
                    z[b, h, i] += w * v[b, h, j]
    return attn.w_o(z.transpose(1, 2).reshape(B, T, C))


@pytest.mark.parametrize("impl", ["auto", "explicit", "tiled"])
@pytest.mark.parametrize("causal", [True, False])
def test_t5_attention_matches_brute_force(impl, causal):
    cfg = CFG.replace(positions="t5", t5_buckets=8, t5_max_distance=6, attn_impl=impl, attn_block=3)
    attn = T5BiasAttention(cfg).double()
    with torch.no_grad():
        attn.rel_bias.normal_()
    x = torch.randn(2, 9, 32, dtype=torch.float64)
    assert torch.allclose(attn.eval()(x, causal=causal), t5_brute(attn, x, causal), atol=1e-10)


def test_t5_parameters_are_buckets_times_heads_and_start_at_zero():
    attn = T5BiasAttention(CFG.replace(positions="t5"))
    plain = sum(p.numel() for p in torch.nn.Linear(32, 32).parameters()) * 4
    assert sum(p.numel() for p in attn.parameters()) - plain == 32 * 4
    lm = DecoderLM(CFG.replace(positions="t5"))  # init_weights leaves the table at zero: no bias at the start
    assert all((layer.self_attn.rel_bias == 0).all() for layer in lm.decoder.layers)


@pytest.mark.parametrize("causal", [True, False])
def test_t5_gradients_equal_on_fused_explicit_and_tiled_paths(causal):
    cfg = CFG.replace(positions="t5", t5_buckets=8, t5_max_distance=6)
    grads, outs = [], []
    x = torch.randn(2, 9, 32)
    for impl in ("auto", "explicit", "tiled"):
        torch.manual_seed(3)
        attn = T5BiasAttention(cfg.replace(attn_impl=impl, attn_block=4))
        with torch.no_grad():
            attn.rel_bias.normal_()
        y = attn(x, causal=causal)
        y.pow(2).sum().backward()
        grads.append(attn.rel_bias.grad.clone())
        outs.append(y.detach())
    for g, y in zip(grads[1:], outs[1:]):
        assert torch.allclose(g, grads[0], atol=1e-4) and torch.allclose(y, outs[0], atol=1e-5)


def test_biases_reach_sdpa_as_a_float_mask(monkeypatch):
    """On the fast path the bias (with -inf at hidden keys) is the attn_mask of F.scaled_dot_product_attention."""
    seen = []
    real = F.scaled_dot_product_attention

    def spy(q, k, v, attn_mask=None, **kw):
        seen.append(attn_mask)
        return real(q, k, v, attn_mask=attn_mask, **kw)

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    for positions in ("alibi", "t5"):
        attn = (ALiBiAttention if positions == "alibi" else T5BiasAttention)(CFG.replace(positions=positions)).eval()
        assert attn.uses_fast_path()
        x = torch.randn(2, 5, 32)
        attn(x, causal=True)
        mask = seen[-1]
        assert mask.dtype == torch.float32 and mask.shape[-2:] == (5, 5)
        assert torch.isinf(mask[..., 0, 1:]).all()  # hidden future keys
        pos = torch.arange(5)[None]
        want = attn.bias(pos, pos)[..., 1, :2]
        assert torch.allclose(mask[..., 1, :2], want.expand_as(mask[..., 1, :2]))


def test_encoder_uses_bidirectional_buckets():
    """Not causal: keys after the query get the upper half of the buckets (a different scalar than keys before)."""
    tagger = EncoderTagger(CFG.replace(positions="t5", n_layers=1))
    attn = tagger.encoder.layers[0].self_attn
    with torch.no_grad():
        attn.rel_bias.copy_(torch.arange(32 * 4, dtype=torch.float32).view(32, 4))
    attn.causal = False
    pos = torch.arange(4)[None]
    b = attn.bias(pos, pos)[0, 0]  # head 0
    assert b[0, 1] != b[1, 0] and b[0, 1] == attn.rel_bias[16 + 1, 0]
