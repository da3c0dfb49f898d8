"""Coding drill: the DPO loss.

Write `dpo_loss(logp_chosen, logp_rejected, ref_chosen, ref_rejected, beta)` (no trl, no
proofs.post_training.objectives), then run `pytest proofs/drills/drill_dpo_loss.py`.
"""

import torch
from torch import Tensor

PAGE = "post-training/dpo.md"


def dpo_loss(logp_chosen: Tensor, logp_rejected: Tensor, ref_chosen: Tensor, ref_rejected: Tensor,
             beta: float = 0.1) -> Tensor:
    """Rafailov et al. 2023, eq. 7, averaged over N preference pairs:
    −log σ(β[(log π(y_w) − log π_ref(y_w)) − (log π(y_l) − log π_ref(y_l))]).
    Each input is (N,): a sequence log-probability (the sum over the response's tokens) of the chosen (y_w) or
    rejected (y_l) response under the policy π or the frozen reference π_ref. Returns a scalar. Keep it finite
    when the margin is large and of either sign."""
    raise NotImplementedError("write the DPO loss here")


# ---- the checks (leave them as they are) ------------------------------------------------------------
import math  # noqa: E402

import pytest  # noqa: E402

from proofs.drills import pick  # noqa: E402
from proofs.post_training.objectives import dpo_loss as shared_dpo_loss  # noqa: E402


def reference(logp_chosen, logp_rejected, ref_chosen, ref_rejected, beta=0.1):
    return shared_dpo_loss(logp_chosen, logp_rejected, ref_chosen, ref_rejected, beta)  # the shared module's own


def _logps(n=16, seed=2):
    g = torch.Generator().manual_seed(seed)
    return [-(torch.rand(n, generator=g) * 40 + 5) for _ in range(4)]  # sequence log-probs: sums of negatives


@pytest.mark.parametrize("beta", [0.01, 0.1, 0.5, 2.0])
def test_matches_the_shared_module(beta):
    f = pick(dpo_loss, reference)
    args = _logps()
    torch.testing.assert_close(f(*args, beta), reference(*args, beta))


@pytest.mark.parametrize("beta", [0.01, 0.1, 1.0, 10.0])
def test_ln2_when_the_policy_is_the_reference(beta):
    f = pick(dpo_loss, reference)
    lc, lr, _, _ = _logps()
    got = f(lc, lr, lc.clone(), lr.clone(), beta).item()
    assert got == pytest.approx(math.log(2), abs=1e-6), "at step 0 every log-ratio is 0, so the loss is -log σ(0)"


def test_the_reference_enters_the_margin():
    f = pick(dpo_loss, reference)
    lc, lr, rc, rr = _logps()
    assert not torch.allclose(f(lc, lr, rc, rr, 0.1), f(lc, lr, rc + 3.0, rr, 0.1)), \
        "a reference that makes y_w likelier must change the loss: it is log π/π_ref, not log π, that is compared"


def test_gradient_pushes_chosen_up_and_rejected_down():
    f = pick(dpo_loss, reference)
    lc, lr, rc, rr = (t.requires_grad_(i < 2) for i, t in enumerate(_logps(n=8)))
    f(lc, lr, rc, rr, 0.5).backward()
    margin = (lc - rc) - (lr - rr)
    weight = 0.5 * torch.sigmoid(-0.5 * margin) / 8  # β·σ(−β·margin)/N: the paper's per-pair weight
    torch.testing.assert_close(lc.grad, -weight.detach())
    torch.testing.assert_close(lr.grad, weight.detach())


def test_finite_for_large_margins():
    f = pick(dpo_loss, reference)
    zero = torch.zeros(2)
    wrong = f(torch.tensor([-2000.0, -3000.0]), zero, zero, zero, 1.0)  # y_w far less likely: margin −2000, −3000
    right = f(zero, torch.tensor([-2000.0, -3000.0]), zero, zero, 1.0)
    assert torch.isfinite(wrong) and wrong.item() == pytest.approx(2500.0), "log(sigmoid(x)) is -inf here: use logsigmoid"
    assert right.item() == pytest.approx(0.0, abs=1e-6)
