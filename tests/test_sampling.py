"""Samplers and beam search of the shared model (proofs/transformer/decoding.py): errors, shapes, a hand-worked
top-p example, and beam search against brute force. Exact checks, no statistics."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from proofs.transformer import (ConfigError, DecoderLM, TransformerConfig, beam_search, filter_logits, gnmt_lp, greedy,
                                lm_beam_fns, nucleus, sample)

V = 3
CFG = TransformerConfig(vocab_size=V, d_model=16, n_heads=2, d_ff=32, n_layers=2, dropout_emb=0.0, dropout_residual=0.0)


def lm(seed: int = 0, cfg: TransformerConfig = CFG) -> DecoderLM:
    torch.manual_seed(seed)
    return DecoderLM(cfg).eval()


def plain(model):
    return lambda ids, n_new: model(ids)[:, -1]


# ---- errors --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kw", [dict(temperature=0.0), dict(temperature=-1.0), dict(temperature=math.nan),
                                dict(temperature=math.inf), dict(temperature=True), dict(top_k=0), dict(top_k=-2),
                                dict(top_k=2.5), dict(top_k=True), dict(top_p=0.0), dict(top_p=1.5),
                                dict(top_p=-0.1), dict(top_p=math.nan)])
def test_filter_rejects_bad_values(kw):
    with pytest.raises(ConfigError, match=next(iter(kw))):
        filter_logits(torch.zeros(2, 5), **kw)


def test_sample_and_beam_reject_bad_arguments():
    model, ids = lm(), torch.zeros(1, 2, dtype=torch.long)
    with pytest.raises(ConfigError, match="steps"):
        sample(plain(model), ids, 0)
    with pytest.raises(ConfigError, match="top_p"):  # checked before the model runs
        sample(plain(model), ids, 2, top_p=2.0)
    with pytest.raises(TypeError):
        sample(plain(model), ids, 2, top_q=0.5)
    with pytest.raises(ConfigError, match="beams"):
        beam_search(plain(model), ids, 2, 0)
    with pytest.raises(ConfigError, match="steps"):
        beam_search(plain(model), ids, 0, 2)
    with pytest.raises(ConfigError, match="length_penalty"):
        beam_search(plain(model), ids, 2, 2, length_penalty=-0.5)
    with pytest.raises(ConfigError, match="eos"):
        beam_search(plain(model), ids, 2, 2, eos=V)


# ---- filters -------------------------------------------------------------------------------------------------

def test_filter_shapes_and_temperature_is_a_division():
    z = torch.randn(2, 4, 7, generator=torch.Generator().manual_seed(0))
    assert filter_logits(z, top_k=3, top_p=0.5).shape == z.shape
    assert torch.equal(filter_logits(z, temperature=0.5), z / 0.5)
    assert torch.equal(filter_logits(z), z)  # no filter: unchanged
    assert torch.equal(filter_logits(z, top_k=7), z) and torch.equal(filter_logits(z, top_k=100), z)  # k >= V keeps all
    assert torch.equal(filter_logits(z, top_p=1.0), z)  # p = 1 keeps all


def test_top_k_keeps_exactly_k_even_with_ties():
    z = torch.tensor([1.0, 3.0, 3.0, 3.0, 0.0])
    kept = torch.isfinite(filter_logits(z, top_k=2))
    assert int(kept.sum()) == 2 and not kept[0] and not kept[4]
    one = filter_logits(torch.tensor([0.1, 2.0, -1.0]), top_k=1)
    assert torch.isfinite(one).tolist() == [False, True, False]


def test_top_p_hand_worked():
    # sorted: 0.4 (token 2), 0.3 (token 0), 0.2 (token 3), 0.1 (token 1); running sums 0.4, 0.7, 0.9, 1.0
    probs = torch.tensor([0.3, 0.1, 0.4, 0.2], dtype=torch.float64)
    assert nucleus(probs, 0.35).tolist() == [False, False, True, False]  # 0.4 >= 0.35 already
    assert nucleus(probs, 0.5).tolist() == [True, False, True, False]  # 0.4 < 0.5: token 0 crosses to 0.7
    assert nucleus(probs, 0.8).tolist() == [True, False, True, True]  # crosses at token 3 (0.9)
    assert nucleus(probs, 0.95).tolist() == [True, True, True, True]
    assert nucleus(probs, 1e-9).tolist() == [False, False, True, False]  # the top token whatever p
    out = filter_logits(probs.log(), top_p=0.5).softmax(-1)
    torch.testing.assert_close(out, torch.tensor([3 / 7, 0, 4 / 7, 0], dtype=torch.float64))  # renormalised
    batched = nucleus(torch.stack([probs, probs.flip(0)]), 0.5)  # (2, V): each row on its own
    assert batched[1].tolist() == [False, True, False, True]


# ---- sampling ------------------------------------------------------------------------------------------------

def test_sample_shapes_and_seeded_reproducibility():
    model, ids = lm(1), torch.randint(0, V, (4, 3), generator=torch.Generator().manual_seed(1))
    a, logits = sample(plain(model), ids, 5, torch.Generator().manual_seed(7), temperature=1.3, top_p=0.9)
    b, _ = sample(plain(model), ids, 5, torch.Generator().manual_seed(7), temperature=1.3, top_p=0.9)
    assert a.shape == (4, 8) and logits.shape == (4, 5, V) and torch.equal(a[:, :3], ids)
    assert torch.equal(a, b)


def test_top_k_1_sampling_is_greedy_with_and_without_cache():
    model, ids = lm(2), torch.randint(0, V, (3, 4), generator=torch.Generator().manual_seed(2))
    expected = model.generate(ids, 6, use_cache=False)[0]
    fn, _, _ = lm_beam_fns(model)  # the cached next-token function: feeds only the new token
    got, _ = sample(fn, ids, 6, torch.Generator().manual_seed(0), top_k=1)
    assert torch.equal(got, expected)


# ---- beam search ---------------------------------------------------------------------------------------------

def brute(model: DecoderLM, prompt: torch.Tensor, steps: int, eos=None, alpha: float = 0.0):
    """Every complete continuation of one prompt (1, T), scored by full forward passes: (score, logp, ids, length)."""
    out = []
    for cont in itertools.product(range(V), repeat=steps):
        if eos is not None and eos in cont:
            n = cont.index(eos) + 1
            if any(t != eos for t in cont[n:]):
                continue  # the same output as its eos-padded twin
        else:
            n = steps
        ids = torch.cat([prompt, torch.tensor([cont])], 1)
        with torch.no_grad():
            lp = model(ids[:, :-1]).log_softmax(-1)[0, prompt.shape[1] - 1:]
        logp = sum(lp[i, cont[i]].item() for i in range(n))
        out.append((logp / ((5 + n) / 6) ** alpha, logp, list(cont), n))
    return sorted(out, key=lambda r: -r[0])


@pytest.mark.parametrize("eos,alpha", [(None, 0.0), (0, 0.0), (0, 1.0)])
def test_beam_as_wide_as_the_tree_is_brute_force(eos, alpha):
    model, prompt, steps = lm(3), torch.tensor([[1, 2]]), 3
    expected = brute(model, prompt, steps, eos, alpha)
    fn, reorder, _ = lm_beam_fns(model)
    b = beam_search(fn, prompt, steps, V ** steps, eos=eos, length_penalty=alpha, reorder=reorder)
    real = torch.isfinite(b.logprob[0])  # the rest are empty slots: fewer sequences exist than beams
    assert int(real.sum()) == len(expected)
    assert b.ids[0, real][:, 2:].tolist() == [r[2] for r in expected]  # same outputs, same order
    torch.testing.assert_close(b.logprob[0, real], torch.tensor([r[1] for r in expected]), atol=1e-5, rtol=0)
    assert b.length[0, real].tolist() == [r[3] for r in expected]
    scores = b.logprob[0, real] / gnmt_lp(b.length[0, real], alpha)
    assert bool((scores[:-1] >= scores[1:]).all())  # best first


def test_one_beam_is_greedy():
    model, ids = lm(4), torch.randint(0, V, (3, 3), generator=torch.Generator().manual_seed(4))
    fn, reorder, _ = lm_beam_fns(model)
    b = beam_search(fn, ids, 6, 1, reorder=reorder)
    g_ids, g_logits = greedy(plain(model), ids, 6)
    assert torch.equal(b.ids[:, 0], g_ids)
    torch.testing.assert_close(b.logprob[:, 0], g_logits.log_softmax(-1).gather(2, g_ids[:, 3:, None]).sum((1, 2)))


def test_beam_shapes_batch_rows_are_independent_and_cache_equals_refeeding():
    model = lm(5, CFG.replace(vocab_size=6))
    ids = torch.randint(0, 6, (3, 4), generator=torch.Generator().manual_seed(5))
    fn, reorder, cache = lm_beam_fns(model)
    b = beam_search(fn, ids, 5, 4, eos=0, length_penalty=0.6, reorder=reorder)
    assert b.ids.shape == (3, 4, 9) and b.logprob.shape == (3, 4) and b.length.shape == (3, 4)
    assert cache[0]["self"].entries[0].shape[0] == 3 * 4  # one cache row per hypothesis
    fn0, none, _ = lm_beam_fns(model, use_cache=False)
    assert none is None
    refed = beam_search(fn0, ids, 5, 4, eos=0, length_penalty=0.6)
    assert torch.equal(b.ids, refed.ids) and torch.allclose(b.logprob, refed.logprob, atol=1e-5)
    for r in range(3):  # each prompt alone gives the same beams
        fn1, reorder1, _ = lm_beam_fns(model)
        one = beam_search(fn1, ids[r:r + 1], 5, 4, eos=0, length_penalty=0.6, reorder=reorder1)
        assert torch.equal(one.ids[0], b.ids[r]) and torch.allclose(one.logprob[0], b.logprob[r], atol=1e-5)
    cont = b.ids[..., 4:]  # after a hypothesis's eos only eos padding, and length counts up to the first eos
    for row, n in zip(cont.reshape(-1, 5).tolist(), b.length.reshape(-1).tolist()):
        if 0 in row:
            assert n == row.index(0) + 1 and set(row[n:]) <= {0}
        else:
            assert n == 5
