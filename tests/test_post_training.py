"""The post-training objectives (proofs/post_training/objectives.py): each against a hand computation, and each bad
setting raising a ConfigError that names the fix."""

from __future__ import annotations

import math

import pytest
import torch

from proofs.post_training import objectives as O
from proofs.transformer import ConfigError


def raises(match):
    return pytest.raises(ConfigError, match=match)


def test_sft_labels_ignore_the_prompt_and_keep_eos():
    ids = torch.tensor([[5, 6, 7, 8, 2], [5, 6, 7, 8, 2]])  # 2 = EOS
    assert O.response_labels(ids, 2).tolist() == [[O.IGNORE, 7, 8, 2]] * 2
    assert O.response_labels(ids, torch.tensor([1, 3])).tolist() == [[6, 7, 8, 2], [O.IGNORE, O.IGNORE, 8, 2]]
    assert O.response_labels(ids, 2, mask_prompt=False).tolist() == ids[:, 1:].tolist()
    with raises(r"prompt_len must be in \[1, 4\]"):
        O.response_labels(ids, 5)


def test_sequence_logprob_sums_the_labelled_tokens_only():
    logits = torch.randn(1, 3, 5, generator=torch.Generator().manual_seed(0))
    labels = torch.tensor([[O.IGNORE, 1, 4]])
    lp = logits.log_softmax(-1)
    assert O.sequence_logprob(logits, labels).item() == pytest.approx((lp[0, 1, 1] + lp[0, 2, 4]).item())
    with raises(r"logits \(1, 3, 5\) and labels \(1, 2\) disagree"):
        O.token_logprobs(logits, labels[:, :2])


def test_bradley_terry_and_dpo_at_a_tie_are_ln_2_and_check_their_inputs():
    z = torch.zeros(4)
    assert O.bradley_terry_loss(z, z).item() == pytest.approx(math.log(2))
    assert O.dpo_loss(z, z, z, z, beta=3.0).item() == pytest.approx(math.log(2))
    with raises(r"one shape"):
        O.bradley_terry_loss(z, torch.zeros(3))
    with raises(r"beta must be > 0"):
        O.dpo_loss(z, z, z, z, beta=0.0)


def test_kl_estimators_on_one_sample():
    k = O.kl_estimators(torch.tensor([math.log(0.5)]), torch.tensor([math.log(0.25)]))  # r = 0.5
    assert k["k1"].item() == pytest.approx(math.log(2))
    assert k["k2"].item() == pytest.approx(0.5 * math.log(2) ** 2)
    assert k["k3"].item() == pytest.approx(-0.5 + math.log(2))


def test_ppo_clip_values_and_bad_ranges():
    lp = torch.log(torch.tensor([1.5, 1.5, 0.5, 0.5]))
    adv = torch.tensor([1.0, -1.0, 1.0, -1.0])
    out = O.ppo_clip_objective(lp, torch.zeros(4), adv, eps=0.2)
    assert out.tolist() == pytest.approx([1.2, -1.5, 0.5, -0.8])  # min(ρA, clip(ρ)A)
    assert O.ppo_clip_objective(lp, torch.zeros(4), adv, eps=0.2, eps_high=0.6)[0].item() == pytest.approx(1.5)
    for eps in (0.0, 1.0, -0.1):
        with raises(r"0 < eps < 1"):
            O.ppo_clip_objective(lp, torch.zeros(4), adv, eps=eps)


def test_group_advantages_and_their_errors():
    a = O.group_advantages(torch.tensor([[1.0, 0.0, 1.0, 0.0], [1.0, 1.0, 1.0, 1.0]]))
    assert a[1].abs().max().item() == 0.0 and a[0].sum().item() == pytest.approx(0.0, abs=1e-6)
    assert O.group_advantages(torch.tensor([[1.0, 0.0]]), scale="none").tolist() == [[0.5, -0.5]]
    with raises(r"sample G >= 2"):
        O.group_advantages(torch.ones(3, 1))
    with raises(r"\(prompts, group\)"):
        O.group_advantages(torch.ones(4))
    with raises(r"'std' \(GRPO\) or 'none'"):
        O.group_advantages(torch.ones(2, 2), scale="mean")


def test_grpo_loss_normalisations_weigh_tokens_as_documented():
    mask = torch.tensor([[1.0, 1.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]])  # outputs of 2 and 4 tokens
    logp = torch.zeros(2, 4, requires_grad=True)
    weights = {}
    for norm in ("sequence", "token", "constant"):
        logp.grad = None
        O.grpo_loss(logp, logp.detach(), torch.tensor([1.0, 1.0]), mask, norm=norm, max_len=4).backward()
        weights[norm] = (-logp.grad[0, 0].item(), -logp.grad[1, 0].item())
    assert weights["sequence"] == pytest.approx((1 / 4, 1 / 8))  # 1/(N·|o_i|)
    assert weights["token"] == pytest.approx((1 / 6, 1 / 6))  # 1/Σ|o_i|
    assert weights["constant"] == pytest.approx((1 / 8, 1 / 8))  # 1/(N·max_len)
    with raises(r"pass max_len"):
        O.grpo_loss(logp, logp, torch.ones(2), mask, norm="constant")
    with raises(r"beta > 0 needs logp_ref"):
        O.grpo_loss(logp, logp, torch.ones(2), mask, beta=0.04)
    with raises(r"norm must be"):
        O.grpo_loss(logp, logp, torch.ones(2), mask, norm="batch")
    with raises(r"advantages must be \(N,\)"):
        O.grpo_loss(logp, logp, torch.ones(3), mask)


def test_kl_regularised_optimum_and_distillation_checks():
    ref = torch.full((4,), 0.25)
    r = torch.tensor([0.0, 1.0, 2.0, 3.0])
    assert O.kl_regularised_optimum(ref, r, 1.0).tolist() == pytest.approx((r.exp() / r.exp().sum()).tolist())
    with raises(r"beta must be > 0"):
        O.kl_regularised_optimum(ref, r, 0.0)
    with raises(r"T must be > 0"):
        O.distillation_loss(torch.zeros(2, 3), torch.zeros(2, 3), T=0.0)
    with raises(r"one vocabulary"):
        O.distillation_loss(torch.zeros(2, 3), torch.zeros(2, 4))
