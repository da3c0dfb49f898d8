"""RoPE in the shared model against independent formulas.

- the angles: Su et al. (2021) eq. 15, theta_i = base^(-2(i-1)/d), and the long-context scalings written from
  their papers (position interpolation: m -> m/s; NTK-aware: base -> base·s^(d/(d-2)); YaRN: the ramp of
  Peng et al. 2023, §3.2, evaluated pair by pair in plain Python, and its temperature sqrt(1/t) = 0.1 ln s + 1);
- the rotation: complex multiplication (torch.polar / torch.view_as_complex), as in Meta's LLaMA code, for
  the interleaved layout; Hugging Face's rotate_half formula for the half layout; the explicit 2x2 rotation
  matrix of RoFormer eq. 13 for one pair;
- the permutation between layouts: the `permute` of Hugging Face's convert_llama_weights_to_hf.py;
- RotaryAttention: a brute-force loop over (b, h, i, j) with rotated q, k and unrotated v; a cached
  decoding equal to the full pass; explicit positions; GQA.
"""

import math

import pytest
import torch
import torch.nn.functional as F

from proofs.transformer import (
    ConfigError,
    DecoderLM,
    RotaryAttention,
    TransformerConfig,
    apply_rope,
    rope_cos_sin,
    rope_inv_freq,
    rope_permutation,
)
from proofs.transformer.positions import rope_attention_factor

CFG = TransformerConfig(d_model=32, n_heads=4, positions="rope", dropout_emb=0.0, dropout_residual=0.0)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


# --- the angles -------------------------------------------------------------------------------

@pytest.mark.parametrize("d", [2, 8, 64, 128])
@pytest.mark.parametrize("base", [10000.0, 500000.0])
def test_frequencies_are_su_et_al_eq_15(d, base):
    want = [base ** (-2 * (i - 1) / d) for i in range(1, d // 2 + 1)]  # i = 1 .. d/2, as in the paper
    got = rope_inv_freq(d, base)
    assert got.dtype == torch.float64 and got.tolist() == pytest.approx(want, rel=1e-14)


@pytest.mark.parametrize("factor", [2.0, 4.0, 8.0])
def test_position_interpolation_divides_positions(factor):
    """Chen et al. (2023): position m is used as m·L/L' = m/s; the angle m·theta/s."""
    d, pos = 16, torch.arange(0, 300, 7)
    plain = pos[:, None].double() / factor * rope_inv_freq(d)
    scaled = pos[:, None].double() * rope_inv_freq(d, scaling="linear", factor=factor)
    assert torch.allclose(plain, scaled, rtol=1e-14, atol=0)


@pytest.mark.parametrize("d", [8, 64, 128])
@pytest.mark.parametrize("factor", [2.0, 4.0, 16.0])
def test_ntk_aware_base(d, factor):
    """bloc97 (2023): base' = base · s^(d/(d-2)); the highest frequency is kept, the lowest divided by s."""
    base2 = 10000.0 * factor ** (d / (d - 2))
    want = [base2 ** (-2 * i / d) for i in range(d // 2)]
    got = rope_inv_freq(d, scaling="ntk", factor=factor)
    assert got.tolist() == pytest.approx(want, rel=1e-12)
    plain = rope_inv_freq(d)
    assert got[0] == plain[0] and got[-1].item() == pytest.approx(plain[-1].item() / factor, rel=1e-12)


def yarn_reference(d, base, s, L, alpha=1.0, beta=32.0):
    """Peng et al. (2023) §3.2, Definition 2, pair by pair: r = L / lambda, lambda = 2 pi / theta."""
    out = []
    for i in range(d // 2):
        theta = base ** (-2 * i / d)
        r = L / (2 * math.pi / theta)
        gamma = 0.0 if r < alpha else 1.0 if r > beta else (r - alpha) / (beta - alpha)
        out.append((1 - gamma) * theta / s + gamma * theta)
    return out


@pytest.mark.parametrize("d,L", [(8, 32), (64, 2048), (128, 4096)])
@pytest.mark.parametrize("factor", [2.0, 4.0, 32.0])
def test_yarn_ramp(d, L, factor):
    got = rope_inv_freq(d, scaling="yarn", factor=factor, train_len=L)
    assert got.tolist() == pytest.approx(yarn_reference(d, 10000.0, factor, L), rel=1e-12)
    plain = rope_inv_freq(d)
    turns = L * plain / (2 * math.pi)
    assert torch.equal(got[turns > 32], plain[turns > 32])  # fast pairs untouched
    assert torch.allclose(got[turns < 1], plain[turns < 1] / factor, rtol=1e-14)  # slow pairs: PI


def test_yarn_temperature_scales_logits_by_its_square():
    """sqrt(1/t) = 0.1 ln(s) + 1 multiplies q and k, so the logits by (0.1 ln s + 1)^2."""
    assert rope_attention_factor("yarn", 16.0) == pytest.approx(0.1 * math.log(16.0) + 1)
    assert rope_attention_factor("yarn", 1.0) == 1.0 and rope_attention_factor("linear", 16.0) == 1.0
    cfg = CFG.replace(rope_scaling="yarn", rope_factor=16.0, rope_train_len=64, attn_impl="explicit")
    attn = RotaryAttention(cfg).double()
    q, k = torch.randn(2, 4, 5, 8, dtype=torch.float64), torch.randn(2, 4, 5, 8, dtype=torch.float64)
    pos = torch.arange(5)[None]
    rq, (rk, _) = attn.place(q, (k, k), pos, pos)
    cos, sin = rope_cos_sin(pos, attn.inv_freq, torch.float64)
    plain = apply_rope(q, cos, sin) @ apply_rope(k, cos, sin).transpose(-1, -2)
    assert torch.allclose(rq @ rk.transpose(-1, -2), plain * (0.1 * math.log(16.0) + 1) ** 2, rtol=1e-12)


def test_scaling_without_rope_is_refused():
    with pytest.raises(ConfigError, match="positions='rope'"):
        TransformerConfig(rope_scaling="linear", rope_factor=2.0)
    with pytest.raises(ConfigError, match="rope_factor"):
        TransformerConfig(positions="rope", rope_scaling="linear", rope_factor=0.5)


# --- the rotation -----------------------------------------------------------------------------

def angles(T, d, start=0):
    pos = torch.arange(start, start + T)[None]
    return pos, rope_cos_sin(pos, rope_inv_freq(d), torch.float64)


def test_interleaved_is_complex_multiplication():
    """Meta's LLaMA: view pairs (2i, 2i+1) as complex numbers and multiply by e^{i m theta_i} (torch.polar)."""
    B, h, T, d = 2, 3, 7, 16
    x = torch.randn(B, h, T, d, dtype=torch.float64)
    pos, (cos, sin) = angles(T, d, start=5)
    rot = torch.polar(torch.ones(T, d // 2, dtype=torch.float64), pos[0, :, None].double() * rope_inv_freq(d))
    want = torch.view_as_real(torch.view_as_complex(x.reshape(B, h, T, d // 2, 2)) * rot).flatten(-2)
    assert torch.allclose(apply_rope(x, cos, sin, "interleaved"), want, atol=1e-13)


def rotate_half(x):
    """Hugging Face transformers' rotate_half."""
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def test_half_layout_is_hugging_face_rotate_half():
    """q·cos + rotate_half(q)·sin with cos, sin of the frequencies repeated twice (emb = cat(freqs, freqs))."""
    B, h, T, d = 2, 3, 7, 16
    x = torch.randn(B, h, T, d, dtype=torch.float64)
    pos, (cos, sin) = angles(T, d, start=3)
    freqs = pos[0, :, None].double() * rope_inv_freq(d)
    emb = torch.cat((freqs, freqs), dim=-1)
    want = x * emb.cos() + rotate_half(x) * emb.sin()
    assert torch.allclose(apply_rope(x, cos, sin, "half"), want, atol=1e-13)


def test_one_pair_is_the_2x2_rotation_matrix():
    """RoFormer eq. 13: (x1, x2) -> [[cos, -sin], [sin, cos]] (x1, x2) at angle m·theta."""
    x = torch.randn(1, 1, 1, 2, dtype=torch.float64)
    m, theta = 11, 1.0  # d = 2: theta_1 = base^0 = 1
    R = torch.tensor([[math.cos(m * theta), -math.sin(m * theta)], [math.sin(m * theta), math.cos(m * theta)]],
                     dtype=torch.float64)
    pos = torch.tensor([[m]])
    cos, sin = rope_cos_sin(pos, rope_inv_freq(2), torch.float64)
    for layout in ("interleaved", "half"):
        assert torch.allclose(apply_rope(x, cos, sin, layout)[0, 0, 0], R @ x[0, 0, 0], atol=1e-14)


def hf_permute(w, n_heads, dim1, dim2):
    """convert_llama_weights_to_hf.py: Meta's interleaved rows -> Hugging Face's rotate-half rows."""
    return w.view(n_heads, dim1 // n_heads // 2, 2, dim2).transpose(1, 2).reshape(dim1, dim2)


@pytest.mark.parametrize("hs,n_heads", [(8, 4), (16, 2), (64, 3)])
def test_permutation_is_hugging_faces(hs, n_heads):
    C = 12
    w = torch.randn(n_heads * hs, C)
    perm = rope_permutation(hs)
    ours = w.view(n_heads, hs, C)[:, perm].reshape(n_heads * hs, C)
    assert torch.equal(ours, hf_permute(w, n_heads, n_heads * hs, C))


# --- RotaryAttention ----------------------------------------------------------------------------

def brute_force(attn, x, causal):
    """Output (B, T, C) from the equations, one (b, h, i, j) at a time: rotated q, k; values as projected."""
    B, T, C = x.shape
    q, k, v = attn.project(x, x)  # (B, nh, T, hs), no positions
    hs = attn.d_head
    theta = rope_inv_freq(hs, attn.cfg.rope_base).tolist()

    def rot(vec, m):  # interleaved pairs (2i, 2i+1)
        out = vec.clone()
        for i, th in enumerate(theta):
            a, b = vec[2 * i], vec[2 * i + 1]
            out[2 * i] = a * math.cos(m * th) - b * math.sin(m * th)
            out[2 * i + 1] = a * math.sin(m * th) + b * math.cos(m * th)
        return out

    z = torch.zeros(B, attn.n_heads, T, hs, dtype=x.dtype)
    for b in range(B):
        for h in range(attn.n_heads):
            for i in range(T):
                keys = [j for j in range(T) if not (causal and j > i)]
                e = torch.stack([torch.dot(rot(q[b, h, i], i), rot(k[b, h, j], j)) / math.sqrt(hs) for j in keys])
                a = torch.softmax(e, 0)
                for w, j in zip(a, keys):
                    z[b, h, i] += w * v[b, h, j]
    return attn.w_o(z.transpose(1, 2).reshape(B, T, C))


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("impl", ["auto", "explicit", "tiled"])
def test_rotary_attention_matches_brute_force(causal, impl):
    attn = RotaryAttention(CFG.replace(attn_impl=impl, attn_block=3)).double().eval()
    x = torch.randn(2, 6, 32, dtype=torch.float64)
    assert torch.allclose(attn(x, causal=causal), brute_force(attn, x, causal), atol=1e-10)


def test_values_are_not_rotated():
    attn = RotaryAttention(CFG).double()
    q, k, v = (torch.randn(1, 4, 5, 8, dtype=torch.float64) for _ in range(3))
    pos = torch.arange(3, 8)[None]
    _, (rk, rv) = attn.place(q, (k, v), pos, pos)
    assert rv is v and not torch.allclose(rk, k)


def test_cached_decoding_equals_the_full_pass_and_caches_rotated_keys():
    torch.manual_seed(1)
    lm = DecoderLM(CFG.replace(n_layers=2, vocab_size=20)).eval()
    ids = torch.randint(1, 20, (3, 9))
    full = lm(ids)
    cache = lm.decoder.new_cache()
    steps = torch.cat([lm(ids[:, t:t + 1], cache=cache) for t in range(ids.shape[1])], dim=1)
    assert (steps - full).abs().max() < 1e-5
    # the first layer's cached keys are the rotated projections of its input
    attn = lm.decoder.layers[0].self_attn
    k, _ = attn.project_kv(lm.embed(ids))  # Post-LN (the default): the first layer attends over the embeddings
    cached_k = cache[0]["self"].entries[0]
    assert torch.allclose(cached_k, attn.rotate(k, torch.arange(9)[None]), atol=1e-6)


def test_explicit_positions_shift_nothing_but_the_angles():
    """Same tokens at positions p..p+T-1 and at 0..T-1 (no cache): identical outputs, since only offsets enter."""
    attn = RotaryAttention(CFG).double().eval()
    x = torch.randn(2, 6, 32, dtype=torch.float64)
    from proofs.transformer import KVCache
    outs = []
    for start in (0, 1000):
        outs.append(attn(x, causal=True, cache=KVCache(), positions=torch.arange(start, start + 6)[None].expand(2, -1)))
    assert torch.allclose(outs[0], outs[1], atol=1e-9)


def test_grouped_query_heads_rotate_each_key_head():
    cfg = CFG.replace(n_kv_heads=2, attn_impl="explicit")
    attn = RotaryAttention(cfg).double().eval()
    x = torch.randn(2, 5, 32, dtype=torch.float64)
    q, k, v = attn.project(x, x)  # k, v repeated to 4 heads
    pos = torch.arange(5)[None]
    cos, sin = rope_cos_sin(pos, attn.inv_freq, torch.float64)
    s = apply_rope(q, cos, sin) @ apply_rope(k, cos, sin).transpose(-1, -2) / math.sqrt(8)
    s = s.masked_fill(torch.ones(5, 5, dtype=torch.bool).triu(1), float("-inf"))
    y = attn.w_o((torch.softmax(s, -1) @ v).transpose(1, 2).reshape(2, 5, 32))
    assert torch.allclose(attn(x, causal=True), y, atol=1e-10)


def test_sdpa_reference_for_the_fast_path():
    """The fused path of RotaryAttention is F.scaled_dot_product_attention on the rotated q, k."""
    attn = RotaryAttention(CFG).eval()
    assert attn.uses_fast_path()
    x = torch.randn(2, 7, 32)
    q, k, v = attn.project(x, x)
    pos = torch.arange(7)[None]
    cos, sin = rope_cos_sin(pos, attn.inv_freq, q.dtype)
    y = F.scaled_dot_product_attention(apply_rope(q, cos, sin), apply_rope(k, cos, sin), v, is_causal=True)
    assert torch.allclose(attn(x, causal=True), attn.w_o(y.transpose(1, 2).reshape(2, 7, 32)), atol=1e-5)


def test_odd_head_size_is_refused():
    with pytest.raises(ConfigError, match="even"):
        TransformerConfig(d_model=12, n_heads=4, positions="rope")
