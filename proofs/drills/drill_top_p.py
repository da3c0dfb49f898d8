"""Coding drill: top-p (nucleus) filtering.

Write `top_p_filter(logits, p)` (sort, running sum, keep the smallest set of most likely tokens whose probability
reaches p, including the token that crosses p), then run `pytest proofs/drills/drill_top_p.py`.
"""

import torch
from torch import Tensor

PAGE = "generation/sampling.md"


def top_p_filter(logits: Tensor, p: float) -> Tensor:
    """logits (..., V) with -inf at every token outside the nucleus of softmax(logits): the smallest set of most
    likely tokens whose probabilities add up to at least p (0 < p <= 1). The most likely token is always kept."""
    raise NotImplementedError("write top-p filtering here")


# ---- the checks (leave them as they are) ------------------------------------------------------------
import pytest  # noqa: E402

from proofs.drills import pick  # noqa: E402
from proofs.transformer import filter_logits  # noqa: E402


def reference(logits: Tensor, p: float) -> Tensor:
    return filter_logits(logits, top_p=p)  # the shared model's own filter


@pytest.mark.parametrize("p", [0.05, 0.3, 0.62, 0.9, 1.0])
def test_matches_the_shared_model(p):
    f = pick(top_p_filter, reference)
    logits = torch.randn(4, 6, 11, generator=torch.Generator().manual_seed(3)) * 2
    got, expected = f(logits, p), reference(logits, p)
    assert torch.equal(torch.isfinite(got), torch.isfinite(expected))  # the same tokens kept
    torch.testing.assert_close(got.softmax(-1), expected.softmax(-1))


def test_keeps_the_token_that_crosses_p():
    f = pick(top_p_filter, reference)
    probs = torch.tensor([0.5, 0.25, 0.125, 0.0625, 0.0625])  # running sums 0.5, 0.75, ...
    kept = torch.isfinite(f(probs.log(), 0.7)).tolist()
    assert kept == [True, True, False, False, False], "0.5 < 0.7, so token 1 (reaching 0.75) belongs to the nucleus"


def test_never_keeps_nothing():
    f = pick(top_p_filter, reference)
    kept = torch.isfinite(f(torch.tensor([5.0, 1.0, 0.0]), 0.1))  # the top token alone holds ~98 %
    assert kept.tolist() == [True, False, False], "the most likely token is always kept ('cumsum <= p' keeps none)"
