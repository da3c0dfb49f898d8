"""Coding drill: beam search.

Write `beam_search(last_logits, prompt, steps, beams)` (keep the `beams` most probable partial continuations,
extend each by every token, keep the best `beams` again), then run `pytest proofs/drills/drill_beam_search.py`.
"""

import itertools

import torch
from torch import Tensor

PAGE = "generation/beam-search.md"


def beam_search(last_logits, prompt: Tensor, steps: int, beams: int) -> tuple[Tensor, Tensor]:
    """Continue prompt (1, T) by `steps` tokens. last_logits(ids, n_new) takes ids (H, L), one row per
    hypothesis, and returns the (H, V) next-token logits (it recomputes everything: ignore n_new, pass ids.shape[1]).

    Returns (beams, T + steps) ids and (beams,) their log-probabilities log P(continuation | prompt), best first.
    No end-of-sequence token and no length normalisation.
    """
    raise NotImplementedError("write beam search here")


# ---- the checks (leave them as they are) ------------------------------------------------------------
from proofs.drills import pick  # noqa: E402
from proofs.transformer import DecoderLM, TransformerConfig, greedy  # noqa: E402
from proofs.transformer import beam_search as shared_beam_search  # noqa: E402


def reference(last_logits, prompt: Tensor, steps: int, beams: int) -> tuple[Tensor, Tensor]:
    b = shared_beam_search(last_logits, prompt, steps, beams)  # the shared model's own beam search
    return b.ids[0], b.logprob[0]


def tiny(seed: int, vocab: int = 5) -> DecoderLM:
    torch.manual_seed(seed)
    return DecoderLM(TransformerConfig(vocab_size=vocab, d_model=16, n_heads=2, d_ff=32, n_layers=1,
                                       dropout_emb=0.0, dropout_residual=0.0)).eval()


def test_matches_the_shared_model():
    f = pick(beam_search, reference)
    for seed in range(3):
        model = tiny(seed)
        fn = lambda ids, n_new: model(ids)[:, -1]
        with torch.no_grad():
            ids, logp = f(fn, torch.tensor([[1, 2, 3]]), 4, 3)
            ref_ids, ref_logp = reference(fn, torch.tensor([[1, 2, 3]]), 4, 3)
        assert torch.equal(ids, ref_ids)
        torch.testing.assert_close(logp, ref_logp, atol=1e-5, rtol=0)


def test_one_beam_is_greedy():
    f = pick(beam_search, reference)
    model = tiny(7)
    fn = lambda ids, n_new: model(ids)[:, -1]
    with torch.no_grad():
        ids, _ = f(fn, torch.tensor([[4, 0]]), 6, 1)
        assert torch.equal(ids[0], greedy(fn, torch.tensor([[4, 0]]), 6)[0][0])


def test_a_beam_as_wide_as_the_tree_finds_the_best():
    f = pick(beam_search, reference)
    model, vocab, steps = tiny(9, vocab=3), 3, 3
    fn = lambda ids, n_new: model(ids)[:, -1]
    prompt = torch.tensor([[2, 1]])
    with torch.no_grad():
        best = max(  # every continuation's log-probability, by brute force
            (model(torch.cat([prompt, torch.tensor([c])], 1)[:, :-1]).log_softmax(-1)[0, 1:]
             .gather(1, torch.tensor(c)[:, None]).sum().item(), c)
            for c in itertools.product(range(vocab), repeat=steps))
        ids, logp = f(fn, prompt, steps, vocab ** steps)
    assert ids[0, 2:].tolist() == list(best[1])
    assert abs(logp[0].item() - best[0]) < 1e-5
