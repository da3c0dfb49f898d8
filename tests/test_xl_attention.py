"""Transformer-XL attention and segment recurrence against a brute-force reference (fp32, atol 1e-5).

The reference loops over every (query, key) pair in plain Python and builds R_{i-j} from
math.sin / math.cos for that pair's distance, so it shares no indexing with the module:
a wrong relative shift (a classic bug of public implementations) cannot cancel out.
"""

import math

import pytest
import torch

from proofs.transformer import (
    ConfigError,
    Decoder,
    DecoderLM,
    TransformerConfig,
    XLAttention,
    causal_mask,
    record_attention,
    rel_shift,
    sinusoidal_table,
)

ATOL = 1e-5
CFG = TransformerConfig(d_model=16, n_heads=2, d_ff=32, positions="xl", dropout_emb=0.0, dropout_residual=0.0)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def xl_head(cfg=CFG) -> XLAttention:
    attn = XLAttention(cfg).eval()
    with torch.no_grad():  # trained-looking biases so that terms (c) and (d) are not ~0
        attn.u.normal_()
        attn.v.normal_()
    return attn


def sinusoid(d: int, C: int) -> torch.Tensor:
    """R_d, one channel at a time: sin(d / 10000^(2i/C)) at channel 2i, cos(same) at 2i+1."""
    return torch.tensor([
        math.sin(d / 10000 ** (c / C)) if c % 2 == 0 else math.cos(d / 10000 ** ((c - 1) / C)) for c in range(C)
    ])


def brute_force_scores(attn: XLAttention, x: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
    """(B, nh, Tq, Tk): A_ij = q_i·k_j + q_i·r_{i-j} + u·k_j + v·r_{i-j}, times 1/sqrt(d_k), pair by pair."""
    B, Tq, C = x.shape
    Tk = kv.shape[1]
    nh, hs = attn.n_heads, attn.d_head
    q = attn.w_q(x).view(B, Tq, nh, hs)
    k = attn.w_k(kv).view(B, Tk, nh, hs)
    out = torch.zeros(B, nh, Tq, Tk)
    for i in range(Tq):
        pos_i = Tk - Tq + i  # queries are the last Tq of the keys' positions
        for j in range(Tk):
            r = attn.w_r(sinusoid(pos_i - j, C).float()).view(nh, hs)  # W_kR R_{i-j}
            for b in range(B):
                for h in range(nh):
                    a = q[b, i, h] @ k[b, j, h]
                    bb = q[b, i, h] @ r[h]
                    c = attn.u[h] @ k[b, j, h]
                    d = attn.v[h] @ r[h]
                    out[b, h, i, j] = (a + bb + c + d) / math.sqrt(hs)
    return out


LENGTHS = [(1, 1), (4, 4), (6, 6), (1, 5), (3, 7), (5, 12)]  # (Tq, Tk); Tk > Tq: a memory of Tk - Tq states


@pytest.mark.parametrize("t_q,t_k", LENGTHS)
def test_scores_match_brute_force(t_q, t_k):
    attn = xl_head()
    kv = torch.randn(2, t_k, 16)
    x = kv[:, -t_q:]
    with torch.no_grad():
        q, k, _ = attn.project(x, kv)
        torch.testing.assert_close(attn.score(q, k), brute_force_scores(attn, x, kv), atol=ATOL, rtol=0)


@pytest.mark.parametrize("t_q,t_k", LENGTHS)
@pytest.mark.parametrize("causal", [True, False])
def test_attention_output_matches_brute_force(t_q, t_k, causal):
    attn = xl_head()
    kv = torch.randn(2, t_k, 16)
    x = kv[:, -t_q:]
    with torch.no_grad():
        s = brute_force_scores(attn, x, kv)
        if causal:
            s = s.masked_fill(causal_mask(t_q, t_k), float("-inf"))
        w = torch.softmax(s, dim=-1)
        v = attn.w_v(kv).view(2, t_k, 2, 8).transpose(1, 2)
        y_ref = attn.w_o((w @ v).transpose(1, 2).reshape(2, t_q, 16))
        with record_attention(attn):
            y = attn(x, kv, causal=causal)
        torch.testing.assert_close(attn.weights, w, atol=ATOL, rtol=0)
        torch.testing.assert_close(y, y_ref, atol=ATOL, rtol=0)
        if causal:  # no weight on a key after its query
            assert attn.weights.masked_fill(~causal_mask(t_q, t_k), 0.0).abs().sum() == 0


@pytest.mark.parametrize("t_q,t_k", LENGTHS)
def test_four_terms_sum_to_score(t_q, t_k):
    attn = xl_head()
    kv = torch.randn(3, t_k, 16)
    with torch.no_grad():
        q, k, _ = attn.project(kv[:, -t_q:], kv)
        terms = attn.score_terms(q, k)
        assert set(terms) == {"a", "b", "c", "d"}
        for t in terms.values():
            assert t.shape == (3, 2, t_q, t_k) and t.abs().max() > 0
        torch.testing.assert_close(sum(terms.values()), attn.score(q, k), atol=ATOL, rtol=0)


def test_rel_shift_moves_each_row_to_its_distance():
    t_q, t_k = 5, 9
    x = torch.randn(2, t_q, t_k + t_q - 1)  # column c: distance t_k - 1 - c
    want = torch.empty(2, t_q, t_k)
    for i in range(t_q):
        for j in range(t_k):
            want[:, i, j] = x[:, i, t_q - 1 - i + j]
    assert torch.equal(rel_shift(x, t_k), want)


@pytest.mark.parametrize("C,nh", [(16, 2), (15, 3)])
def test_relative_sinusoids_are_the_sinusoidal_table(C, nh):
    attn = XLAttention(CFG.replace(d_model=C, n_heads=nh))
    torch.testing.assert_close(attn.sinusoids(torch.arange(20)), sinusoidal_table(20, C), atol=1e-6, rtol=0)
    neg = attn.sinusoids(torch.tensor([-3]))[0]
    torch.testing.assert_close(neg, sinusoid(-3, C).float(), atol=1e-6, rtol=0)


def test_xl_has_separate_position_key_map_and_no_learned_table():
    attn = XLAttention(CFG)
    names = {n: tuple(p.shape) for n, p in attn.named_parameters()}
    assert names["w_r.weight"] == (16, 16) and "w_r.bias" not in names and names["w_k.weight"] == (16, 16)
    assert attn.w_r.weight.data_ptr() != attn.w_k.weight.data_ptr()
    assert names["u"] == names["v"] == (2, 8)
    assert not any(s[0] in (CFG.max_len, 2 * CFG.max_len - 1) for s in names.values())  # no position table


def lm(**overrides) -> DecoderLM:
    return DecoderLM(CFG.replace(**overrides)).eval()


def test_decoder_lm_with_mem_len_zero_equals_no_memory():
    model = lm(mem_len=0)
    a, b = torch.randint(0, 32, (2, 2, 7))
    with torch.no_grad():
        _, mems = model.forward_with_memory(a)
        assert all(m.shape == (2, 0, 16) for m in mems)
        logits, _ = model.forward_with_memory(b, mems)
        torch.testing.assert_close(logits, model(b), atol=0, rtol=0)
        torch.testing.assert_close(model(b, mems=mems), model(b), atol=0, rtol=0)


@pytest.mark.parametrize("overrides", [{"positions": "xl"}, {"positions": "sinusoidal"}, {"norm_position": "pre"}])
def test_plain_call_is_unchanged(overrides):
    model = lm(mem_len=5, **overrides)
    ids = torch.randint(0, 32, (2, 7))
    with torch.no_grad():
        logits, mems = model.forward_with_memory(ids)
        torch.testing.assert_close(logits, model(ids), atol=0, rtol=0)
    assert [tuple(m.shape) for m in mems] == [(2, 5, 16)] * 2


@pytest.mark.parametrize("norm_position", ["post", "pre"])
@pytest.mark.parametrize("n_layers", [1, 3])
def test_cached_segments_equal_one_causal_pass(norm_position, n_layers):
    """With relative positions and a memory that covers the past, recurrence computes exactly the full pass."""
    model = lm(mem_len=12, n_layers=n_layers, norm_position=norm_position)
    ids = torch.randint(0, 32, (2, 12))
    with torch.no_grad():
        full = model(ids)
        mems, parts = None, []
        for seg in ids.split(4, dim=1):
            logits, mems = model.forward_with_memory(seg, mems)
            parts.append(logits)
        torch.testing.assert_close(torch.cat(parts, dim=1), full, atol=ATOL, rtol=0)


def test_absolute_positions_with_memory_do_not_equal_the_full_pass():
    """The same recurrence with absolute sinusoids restarts positions at 0: the cache is not the full pass."""
    model = lm(mem_len=12, positions="sinusoidal")
    ids = torch.randint(0, 32, (2, 8))
    with torch.no_grad():
        _, mems = model.forward_with_memory(ids[:, :4])
        second, _ = model.forward_with_memory(ids[:, 4:], mems)
        assert (second - model(ids)[:, 4:]).abs().max() > 1e-2


def test_memory_is_truncated_and_can_grow_at_evaluation():
    model = lm(mem_len=6)
    ids = torch.randint(0, 32, (1, 4))
    with torch.no_grad():
        mems = None
        for want in (4, 6, 6):
            _, mems = model.forward_with_memory(ids, mems)
            assert mems[0].shape[1] == want
        _, mems = model.forward_with_memory(ids, mems, mem_len=100)  # evaluation: a longer memory
        assert mems[0].shape[1] == 10


def test_memory_is_detached():
    """The next segment reads the cache, but no gradient flows back into the segment that wrote it."""
    dec = Decoder(CFG.replace(mem_len=5), cross=False)
    x1 = torch.randn(2, 5, 16, requires_grad=True)
    x2 = torch.randn(2, 5, 16, requires_grad=True)
    _, mems = dec.forward_with_memory(x1)
    assert all(not m.requires_grad and m.grad_fn is None for m in mems)
    y2, _ = dec.forward_with_memory(x2, mems)
    y2.sum().backward()
    assert x1.grad is None  # nothing reached the previous segment
    assert x2.grad is not None and x2.grad.abs().sum() > 0
    with torch.no_grad():  # ... although the previous segment does change the output
        x1b = x1 + 1.0
        assert (dec.forward_with_memory(x2, dec.forward_with_memory(x1b)[1])[0] - y2).abs().max() > 1e-3


def test_padding_in_the_current_segment_still_masks():
    model = lm(mem_len=4)
    a = torch.randint(1, 32, (2, 4))
    b = torch.randint(1, 32, (2, 4))
    pad = torch.zeros(2, 4, dtype=torch.bool)
    pad[1, 1] = True
    keep = torch.tensor([0, 2, 3])  # the real tokens of row 1; 2 and 3 come after the padding
    with torch.no_grad():
        _, mems = model.forward_with_memory(a)
        y1, _ = model.forward_with_memory(b, mems, padding_mask=pad)
        b2 = b.clone()
        b2[1, 1] = (b[1, 1] % 31) + 1  # change the padded token: no real token may notice
        y2, _ = model.forward_with_memory(b2, mems, padding_mask=pad)
        torch.testing.assert_close(y1[1, keep], y2[1, keep], atol=1e-6, rtol=0)
        y3, _ = model.forward_with_memory(b2, mems)  # without the mask, later tokens do notice
        assert (y3[1, 2:] - y1[1, 2:]).abs().max() > 1e-3


def test_bad_memory_and_mem_len():
    with pytest.raises(ConfigError, match=r"mem_len=-1 must be >= 0"):
        TransformerConfig(mem_len=-1)
    model = lm(mem_len=4)
    ids = torch.randint(0, 32, (2, 4))
    with pytest.raises(ConfigError, match=r"one \(batch=2, M, d_model=16\) tensor per layer \(2\)"):
        model.forward_with_memory(ids, [torch.zeros(2, 3, 16)])
    with pytest.raises(ConfigError, match=r"mem_len=-2 must be >= 0"):
        model.forward_with_memory(ids, mem_len=-2)
