"""Coding drill: GRPO's group-relative advantages.

Write `group_advantages(rewards, scale, eps)` (rewards of G sampled outputs for each of P prompts -> one advantage
per output, every token of an output shares it), then run `pytest proofs/drills/drill_grpo_advantages.py`.
"""

import torch
from torch import Tensor

PAGE = "post-training/grpo.md"


def group_advantages(rewards: Tensor, scale: str = "std", eps: float = 1e-4) -> Tensor:
    """rewards (P, G) -> advantages (P, G): each reward minus the mean of its own group (row); with scale="std"
    (GRPO) also divided by the group's standard deviation + eps, using torch's default sample std (n − 1);
    with scale="none" (Dr. GRPO) not divided. A group whose rewards are all equal gets zeros."""
    raise NotImplementedError("write GRPO's group advantages here")


# ---- the checks (leave them as they are) ------------------------------------------------------------
import pytest  # noqa: E402

from proofs.drills import pick  # noqa: E402
from proofs.post_training.objectives import group_advantages as reference  # noqa: E402  the shared module's own


@pytest.mark.parametrize("scale", ["std", "none"])
def test_matches_the_shared_module(scale):
    f = pick(group_advantages, reference)
    g = torch.Generator().manual_seed(5)
    rewards = torch.randn(6, 8, generator=g, dtype=torch.float64) * 3 + 1
    torch.testing.assert_close(f(rewards, scale=scale), reference(rewards, scale=scale))


def test_binary_group_by_hand():
    f = pick(group_advantages, reference)
    r = torch.tensor([[1.0, 0.0, 0.0, 0.0]], dtype=torch.float64)  # mean 1/4, sample std √(1/4) = 0.5
    torch.testing.assert_close(f(r, scale="none"), torch.tensor([[0.75, -0.25, -0.25, -0.25]], dtype=torch.float64))
    expected = torch.tensor([[0.75, -0.25, -0.25, -0.25]], dtype=torch.float64) / (0.5 + 1e-4)
    torch.testing.assert_close(f(r), expected, msg="divide by the sample std (n − 1) plus eps")


def test_groups_are_rows_and_sum_to_zero():
    f = pick(group_advantages, reference)
    r = torch.tensor([[1.0, 1.0, 0.0, 0.0], [5.0, 5.0, 5.0, 5.0]], dtype=torch.float64)
    a = f(r)
    torch.testing.assert_close(a.sum(1), torch.zeros(2, dtype=torch.float64), atol=1e-12, rtol=0)
    assert torch.equal(a[1], torch.zeros(4, dtype=torch.float64)), "an all-equal group teaches nothing: zeros, not NaN"
    assert a[0, 0] > 0 > a[0, 2], "normalise within each prompt's group (row), not over the whole batch"
