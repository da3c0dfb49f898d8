"""Repetition controls of the shared model (proofs/transformer/penalties.py): the CTRL penalty and its sign bug,
frequency/presence penalties, the no-repeat-n-gram ban, the plug into greedy/sample, and errors. Exact checks."""

from __future__ import annotations

import math

import pytest
import torch

from proofs.transformer import (DecoderLM, TransformerConfig, banned_by_ngram, beam_search, frequency_presence_penalty,
                                greedy, naive_repetition_penalty, no_repeat_ngram, repetition_penalty, sample,
                                with_processors)

Z = torch.tensor([[2.0, -1.0, 0.5, -3.0, 0.0]])  # (1, 5): positive, negative and zero logits
SEEN = torch.tensor([[0, 1, 1]])  # tokens 0 and 1 already in the context (token 1 twice)


# ---- the CTRL penalty and its sign bug ---------------------------------------------------------------------------

def test_right_penalty_divides_positive_and_multiplies_negative_logits():
    out = repetition_penalty(Z, SEEN, 2.0)
    assert torch.equal(out, torch.tensor([[1.0, -2.0, 0.5, -3.0, 0.0]]))  # 2/2 and -1*2; unseen 2..4 unchanged


def test_naive_penalty_divides_every_seen_logit():
    out = naive_repetition_penalty(Z, SEEN, 2.0)
    assert torch.equal(out, torch.tensor([[1.0, -0.5, 0.5, -3.0, 0.0]]))  # -1/2 = -0.5: moved UP


def test_negative_logit_loses_probability_under_the_right_penalty_and_gains_under_the_naive_one():
    only = torch.tensor([[1]])  # token 1 (logit -1) is the only seen token
    p0 = Z.softmax(-1)[0, 1]
    right = repetition_penalty(Z, only, 1.2).softmax(-1)[0, 1]
    naive = naive_repetition_penalty(Z, only, 1.2).softmax(-1)[0, 1]
    assert right < p0 < naive
    # with several seen tokens the probability itself can move either way (the others lose mass too); what always
    # holds is the odds against an unseen token (here token 2): down under the right penalty, up under the naive one
    odds = lambda z: (z[0, 1] - z[0, 2]).exp()
    assert odds(repetition_penalty(Z, SEEN, 1.2)) < odds(Z) < odds(naive_repetition_penalty(Z, SEEN, 1.2))


def test_positive_logit_loses_probability_under_both():
    p0 = Z.softmax(-1)[0, 0]
    assert repetition_penalty(Z, SEEN, 1.2).softmax(-1)[0, 0] < p0
    assert naive_repetition_penalty(Z, SEEN, 1.2).softmax(-1)[0, 0] < p0


def test_theta_one_is_the_identity():
    z = torch.randn(4, 11, generator=torch.Generator().manual_seed(0))
    ids = torch.randint(0, 11, (4, 7), generator=torch.Generator().manual_seed(1))
    assert torch.equal(repetition_penalty(z, ids, 1.0), z)
    assert torch.equal(naive_repetition_penalty(z, ids, 1.0), z)
    assert torch.equal(frequency_presence_penalty(z, ids), z)


def test_unseen_tokens_are_unchanged_and_the_penalty_is_per_row():
    z = torch.randn(3, 9, generator=torch.Generator().manual_seed(2))
    ids = torch.tensor([[0, 0], [3, 4], [8, 3]])
    for f in (repetition_penalty, naive_repetition_penalty):
        out = f(z, ids, 1.7)
        for b, row in enumerate(ids.tolist()):
            unseen = [v for v in range(9) if v not in row]
            assert torch.equal(out[b, unseen], z[b, unseen])
            assert not torch.equal(out[b, sorted(set(row))], z[b, sorted(set(row))])


def test_repeats_in_the_context_do_not_compound_the_ctrl_penalty():
    once = repetition_penalty(Z, torch.tensor([[1]]), 1.5)
    thrice = repetition_penalty(Z, torch.tensor([[1, 1, 1]]), 1.5)
    assert torch.equal(once, thrice)


def test_right_penalty_never_raises_a_seen_token_for_theta_above_one():
    g = torch.Generator().manual_seed(3)
    z = torch.randn(64, 20, generator=g) * 3
    ids = torch.randint(0, 20, (64, 6), generator=g)
    for theta in (1.05, 1.2, 2.0, 10.0):
        out = repetition_penalty(z, ids, theta)
        assert (out <= z).all()
        naive = naive_repetition_penalty(z, ids, theta)
        mask = torch.zeros_like(z, dtype=torch.bool).scatter(1, ids, True)
        assert (naive[mask & (z < 0)] > z[mask & (z < 0)]).all()  # the bug: every seen negative logit rises


# ---- frequency / presence --------------------------------------------------------------------------------------

def test_frequency_counts_every_repeat_and_presence_is_paid_once():
    out = frequency_presence_penalty(Z, SEEN, frequency=0.5, presence=0.25)
    expect = Z - torch.tensor([[0.5 * 1 + 0.25, 0.5 * 2 + 0.25, 0, 0, 0]])
    assert torch.allclose(out, expect, atol=0, rtol=0)


# ---- no-repeat-n-gram -------------------------------------------------------------------------------------------

def test_ngram_ban_blocks_exactly_the_repeating_token():
    ids = torch.tensor([[1, 2, 3, 4, 1, 2]])  # the 3-gram (1, 2, 3) is present; the prefix is (1, 2)
    banned = banned_by_ngram(ids, 3, 6)
    assert banned[0].nonzero().flatten().tolist() == [3]
    out = no_repeat_ngram(torch.zeros(1, 6), ids, 3)
    assert out[0, 3] == -math.inf and torch.isfinite(out[0, [0, 1, 2, 4, 5]]).all()


def test_ngram_ban_several_followers_per_row_and_rows_independent():
    ids = torch.tensor([[5, 0, 5, 2, 5], [1, 1, 1, 1, 3]])  # n = 2: row 0 prefix (5,) was followed by 0 and 2
    banned = banned_by_ngram(ids, 2, 6)
    assert banned[0].nonzero().flatten().tolist() == [0, 2]
    assert banned[1].nonzero().flatten().tolist() == []  # 3 never appeared before the end


def test_ngram_ban_edge_cases():
    ids = torch.tensor([[4, 2]])
    assert not banned_by_ngram(ids, 3, 5).any()  # too short for a complete 3-gram
    assert banned_by_ngram(ids, 1, 5)[0].nonzero().flatten().tolist() == [2, 4]  # n = 1: every seen token
    assert banned_by_ngram(torch.tensor([[3, 3]]), 2, 5)[0].nonzero().flatten().tolist() == [3]


def test_ngram_ban_agrees_with_brute_force():
    g = torch.Generator().manual_seed(4)
    for _ in range(200):
        T, n = int(torch.randint(1, 12, (1,), generator=g)), int(torch.randint(1, 5, (1,), generator=g))
        ids = torch.randint(0, 4, (1, T), generator=g)
        row = ids[0].tolist()
        prefix = tuple(row[T - n + 1:]) if n > 1 else ()
        brute = {row[i + n - 1] for i in range(T - n + 1) if tuple(row[i:i + n - 1]) == prefix}
        assert set(banned_by_ngram(ids, n, 4)[0].nonzero().flatten().tolist()) == brute


# ---- plugging into the decoders ---------------------------------------------------------------------------------

CFG = TransformerConfig(vocab_size=7, d_model=16, n_heads=2, d_ff=32, n_layers=1, dropout_emb=0.0, dropout_residual=0.0)


def lm_fn(seed: int = 0):
    torch.manual_seed(seed)
    model = DecoderLM(CFG).eval()
    return lambda ids, n_new: model(ids)[:, -1]


def test_greedy_with_the_ngram_ban_never_repeats_a_trigram():
    fn, prompts = lm_fn(), torch.tensor([[0, 1], [2, 2], [5, 3]])
    ids, _ = greedy(with_processors(fn, lambda z, i: no_repeat_ngram(z, i, 3)), prompts, 20)
    for row in ids.tolist():
        grams = [tuple(row[i:i + 3]) for i in range(len(row) - 2)]
        assert len(grams) == len(set(grams))


def test_processors_apply_in_order_and_the_decoders_see_the_processed_logits():
    fn, prompts = lm_fn(1), torch.tensor([[0, 1, 2]])
    wrapped = with_processors(fn, lambda z, i: repetition_penalty(z, i, 1.3), lambda z, i: no_repeat_ngram(z, i, 2))
    ids, logits = greedy(wrapped, prompts, 6)
    for t in range(6):
        ctx = ids[:, :3 + t]
        expect = no_repeat_ngram(repetition_penalty(fn(ctx, 0), ctx, 1.3), ctx, 2)
        assert torch.equal(logits[:, t], expect) and ids[0, 3 + t] == expect.argmax(-1)
    s_ids, _ = sample(wrapped, prompts, 6, torch.Generator().manual_seed(0), top_p=0.9)
    assert s_ids.shape == (1, 9)
    beams = beam_search(wrapped, prompts, 4, 2)
    assert beams.ids.shape == (1, 2, 7)


# ---- errors -----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("theta", [0.0, -1.2, math.inf, math.nan, True, "1.2"])
def test_bad_theta_is_rejected(theta):
    for f in (repetition_penalty, naive_repetition_penalty):
        with pytest.raises(ValueError, match="theta"):
            f(Z, SEEN, theta)


@pytest.mark.parametrize("logits,ids,match", [
    (torch.zeros(5), torch.zeros(1, 2, dtype=torch.long), "must be"),
    (torch.zeros(2, 5), torch.zeros(1, 2, dtype=torch.long), "batch sizes"),
    (torch.zeros(1, 5), torch.tensor([[5]]), "0..4"),
    (torch.zeros(1, 5), torch.zeros(1, 2), "integer"),
])
def test_bad_shapes_are_rejected(logits, ids, match):
    for f in (lambda z, i: repetition_penalty(z, i, 1.2), lambda z, i: naive_repetition_penalty(z, i, 1.2),
              lambda z, i: frequency_presence_penalty(z, i, 0.1), lambda z, i: no_repeat_ngram(z, i, 2)):
        with pytest.raises(ValueError, match=match):
            f(logits, ids)


def test_bad_n_and_bad_frequency_and_no_processor_are_rejected():
    for n in (0, -1, 2.0, True):
        with pytest.raises(ValueError, match="n="):
            no_repeat_ngram(Z, SEEN, n)
    with pytest.raises(ValueError, match="frequency"):
        frequency_presence_penalty(Z, SEEN, frequency=math.nan)
    with pytest.raises(ValueError, match="at least one"):
        with_processors(lambda ids, n: Z)
