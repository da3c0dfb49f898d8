# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% [markdown]
# # Verifiable rewards and reward hacking
#
# Proofs for `docs/post-training/verifiable-rewards.md`. A verifiable reward is a program that checks an answer. If
# the program is right, there is nothing to exploit; if it is lenient, the policy can find the outputs it wrongly
# accepts, as it would find the errors of a learned reward model. The toy: ten questions whose answers are the digits
# 0-9, and eleven possible outputs: the ten digits and the string "0123456789". Two checkers score the same outputs:
#
# - strict: the output is exactly the answer (an exact-match check);
# - lenient: the answer occurs somewhere in the output (a substring check, a common shortcut), so "0123456789" passes
#   every question.
#
# The policy is a categorical over the 11 outputs for each question, with logits W[question] + b: a part of its own
# per question and a part b shared by all questions (what a network's shared weights provide). It is trained with
# GRPO from the shared objectives (`group_advantages`, `grpo_loss`; Shao et al. 2024, eq. 3), G = 8 samples per
# question, one update per batch (on-policy, so the clip is inactive), Adam, 150 steps; the reference for the KL
# term is the starting policy. Every arm of one run trains side by side from the same start (the same seeded
# logits), and proxy reward (what the lenient checker pays) and true accuracy (what the strict checker would) are read
# exactly from the policy's probabilities after each step. Thresholds come from seeds 100-139, written beside each
# assert. Run: `pytest proofs/post_training/proof_verifiable_rewards.py`.

# %%
from __future__ import annotations

import functools

import pytest
import torch

from proofs.post_training.objectives import group_advantages, grpo_loss

F64 = torch.float64

# %% [markdown]
# ## The toy: questions, outputs, two checkers

# %%
# --8<-- [start:checkers]
ANSWERS = [str(d) for d in range(10)]               # question q's answer is the digit q
OUTPUTS = [str(d) for d in range(10)] + ["0123456789"]
HEDGE = OUTPUTS.index("0123456789")


def strict_checker(answer: str, output: str) -> bool:
    """Exact match of the final answer (what a math verifier does after extracting it)."""
    return output.strip() == answer


def lenient_checker(answer: str, output: str) -> bool:
    """The answer appears somewhere in the output: a substring check, so listing every digit always passes."""
    return answer in output


def reward_table(checker) -> torch.Tensor:
    """(questions, outputs): the checker's 0/1 verdict on every output for every question."""
    return torch.tensor([[float(checker(a, o)) for o in OUTPUTS] for a in ANSWERS], dtype=F64)
# --8<-- [end:checkers]


STRICT, LENIENT = reward_table(strict_checker), reward_table(lenient_checker)
Q, K = STRICT.shape

# %% [markdown]
# ## GRPO on the categorical policy, every arm side by side
#
# An arm is a checker, a KL coefficient β, whether the shared part b is used, and a head start h0 added to the
# hedge's logit at the start (0: the hedge is as likely as a typical digit). Starting logits are N(0, 0.5²) per
# question and output, the same for every arm of a seed. One GRPO step per arm: 8 samples per question from the
# current policy, the checker's rewards, `group_advantages` (the group's mean subtracted, divided by its std),
# `grpo_loss` with logp_old = logp detached (one update per batch) and, when β > 0, the k3 term against the starting
# policy. The arms' losses are summed and Adam (written out below, PyTorch's defaults) updates each parameter on its
# own, so the arms do not interact.

# %%
# --8<-- [start:train]
STEPS, G, LR, INIT_SD = 150, 8, 0.1, 0.5
ARMS = {  # name: (checker, beta, shared part b used, head start of the hedge's logit)
    "strict": (STRICT, 0.0, True, 0.0),
    "lenient": (LENIENT, 0.0, True, 0.0),
    "lenient, hedge rare at the start": (LENIENT, 0.0, True, -2.0),
    "lenient, no shared part": (LENIENT, 0.0, False, 0.0),
    "lenient, no shared part, hedge ahead": (LENIENT, 0.0, False, 3.0),
    "lenient, beta 0.04": (LENIENT, 0.04, True, 0.0),
    "lenient, beta 0.2": (LENIENT, 0.2, True, 0.0),
    "lenient, beta 1": (LENIENT, 1.0, True, 0.0),
    "strict, beta 1": (STRICT, 1.0, True, 0.0),
}


def adam_step(params, grads, state, t, lr=LR, b1=0.9, b2=0.999, eps=1e-8):
    """One Adam update (Kingma & Ba 2015, Algorithm 1), per coordinate: lr·m̂/(√v̂ + ε)."""
    out = []
    for i, (x, g) in enumerate(zip(params, grads)):
        m, v = state.get(i, (torch.zeros_like(x), torch.zeros_like(x)))
        m, v = b1 * m + (1 - b1) * g, b2 * v + (1 - b2) * g * g
        state[i] = (m, v)
        out.append((x - lr * (m / (1 - b1 ** t)) / ((v / (1 - b2 ** t)).sqrt() + eps)).detach())
    return out


@functools.lru_cache(maxsize=2)
def train_arms(seed: int, n_seeds: int = 3) -> dict[str, dict[str, torch.Tensor]]:
    """Every arm on seeds seed .. seed + n_seeds − 1. Per arm: proxy reward and true accuracy after each step,
    (STEPS + 1, n_seeds) each (mean over the 10 questions, exact under the policy), and the hedge's probability."""
    names, S = list(ARMS), n_seeds
    A = len(names)
    start = torch.stack([torch.randn(Q, K, generator=torch.Generator().manual_seed(seed + s), dtype=F64) * INIT_SD
                         for s in range(S)]).expand(A, S, Q, K).clone()              # (arms, seeds, Q, K)
    start[..., HEDGE] += torch.tensor([ARMS[n][3] for n in names], dtype=F64).view(A, 1, 1)
    shared = torch.tensor([float(ARMS[n][2]) for n in names], dtype=F64).view(A, 1, 1, 1)
    rewards = torch.stack([ARMS[n][0] for n in names]).view(A, 1, Q, K).expand(A, S, Q, K)
    logp_ref = start.log_softmax(-1)
    by_beta: dict[float, list[int]] = {}
    for i, n in enumerate(names):
        by_beta.setdefault(ARMS[n][1], []).append(i)
    params, state = [start.clone(), torch.zeros(A, S, 1, K, dtype=F64)], {}
    g = torch.Generator().manual_seed(seed)
    proxy, acc, hedge = [], [], []
    for t in range(STEPS + 1):
        W, b = (x.requires_grad_(True) for x in params)
        logp = (W + shared * b).log_softmax(-1)                                     # (A, S, Q, K)
        pi = logp.detach().exp()
        proxy.append((pi * LENIENT).sum(-1).mean(-1))
        acc.append((pi * STRICT).sum(-1).mean(-1))
        hedge.append(pi[..., HEDGE].mean(-1))
        if t == STEPS:
            break
        y = torch.multinomial(pi.reshape(-1, K), G, replacement=True, generator=g).view(A, S, Q, G)
        r = rewards.gather(-1, y)                                                    # (A, S, Q, G): 0/1 verdicts
        loss = 0.0
        for beta, idx in by_beta.items():  # grpo_loss takes one β: one call per β, each arm's loss its own mean
            lp = logp[idx].gather(-1, y[idx]).reshape(-1, 1)                        # one "token" per output
            adv = group_advantages(r[idx].reshape(-1, G)).reshape(-1)               # groups = (arm, seed, question)
            ref = logp_ref[idx].gather(-1, y[idx]).reshape(-1, 1) if beta > 0 else None
            loss = loss + len(idx) * S * grpo_loss(lp, lp.detach(), adv, torch.ones_like(lp), beta=beta, logp_ref=ref)
        params = adam_step(params, torch.autograd.grad(loss, [W, b]), state, t + 1)
    proxy, acc, hedge = torch.stack(proxy), torch.stack(acc), torch.stack(hedge)  # (STEPS + 1, A, S)
    return {n: {"proxy": proxy[:, i], "accuracy": acc[:, i], "hedge": hedge[:, i]} for i, n in enumerate(names)}
# --8<-- [end:train]


# %% [markdown]
# ## Reading a run

# %%
# --8<-- [start:summary]
def summary(run: dict[str, torch.Tensor]) -> dict:
    """Per seed: accuracy and proxy at the start, their extremes and the end; the first step at which accuracy is
    below half its start (STEPS + 1 if never)."""
    acc, proxy = run["accuracy"], run["proxy"]
    below = acc < acc[0] / 2
    first = torch.where(below.any(0), below.float().argmax(0), torch.full_like(acc[0], STEPS + 1, dtype=torch.long))
    return {"accuracy start": acc[0], "accuracy min": acc.min(0).values, "accuracy max": acc.max(0).values,
            "accuracy end": acc[-1], "proxy start": proxy[0], "proxy end": proxy[-1], "hedge end": run["hedge"][-1],
            "first step below half": first.float()}


def fmt(x: torch.Tensor) -> list:
    return [round(v, 3) for v in x.tolist()]
# --8<-- [end:summary]


CHECKPOINTS = (0, 10, 30, 150)


def record_arm(ev, name: str, s: dict, run: dict, key: bool = True) -> None:
    ev.record(f"{name}: accuracy at steps 0, 10, 30, 150 (mean of 3 seeds)",
              fmt(run["accuracy"][list(CHECKPOINTS)].mean(-1)), key=key)
    ev.record(f"{name}: proxy reward at steps 0, 10, 30, 150 (mean of 3 seeds)",
              fmt(run["proxy"][list(CHECKPOINTS)].mean(-1)), key=key)
    ev.record(f"{name}: accuracy at the end, per seed", fmt(s["accuracy end"]), key=False)
    ev.record(f"{name}: lowest accuracy / start, per seed", fmt(s["accuracy min"] / s["accuracy start"]), key=False)
    ev.record(f"{name}: hedge probability at the end, per seed", fmt(s["hedge end"]), key=False)


# %% [markdown]
# ## The tests

# %%
@pytest.mark.claim("C-RLVR-1", "confirmed")
def test_grpo_hacks_a_lenient_checker_and_the_strict_checker_is_the_switch(ev, seed):
    """On every seed: with the strict checker accuracy climbs to near 1; with the lenient one the proxy reward climbs
    to near 1 while true accuracy falls far below its start, because the hedge "0123456789" takes the mass. When the
    hedge starts rare, accuracy first rises, then falls once the hedge is found. Would be refuted if accuracy under
    the lenient checker ended near the strict checker's, or did not fall below its start."""
    runs = train_arms(seed)
    s = {n: summary(runs[n]) for n in ("strict", "lenient", "lenient, hedge rare at the start")}
    for name, sm in s.items():
        record_arm(ev, name, sm, runs[name])
    ev.record("lenient: accuracy at the end / at the start, per seed", fmt(s["lenient"]["accuracy end"] /
                                                                          s["lenient"]["accuracy start"]))
    ev.record("lenient: first step with accuracy below half its start, per seed", fmt(s["lenient"]["first step below half"]))
    rare = s["lenient, hedge rare at the start"]
    ev.record("lenient, hedge rare at the start: peak accuracy, per seed", fmt(rare["accuracy max"]))
    st, le = s["strict"], s["lenient"]
    # THRESHOLDS, runs at seeds 100-139 (3 seeds each, 120 values per quantity), mean ± sd (min/max):
    # strict: end accuracy 0.992 ± 0.020 (min 0.896). lenient: end proxy 0.9993 (min 0.9989), proxy gain
    # 0.82 ± 0.02 (min 0.79), end accuracy / start 0.028 ± 0.016 (max 0.14), hedge gain 0.91 ± 0.01 (min 0.88).
    # hedge rare: peak accuracy / start 4.6 ± 0.7 (min 3.1), end / peak 0.07 ± 0.05 (max 0.26).
    assert (st["accuracy end"] > 0.8).all()
    assert (le["proxy end"] > 0.95).all() and (le["proxy end"] > le["proxy start"] + 0.5).all()
    assert (le["accuracy end"] < 0.3 * le["accuracy start"]).all()
    assert (runs["lenient"]["hedge"][-1] > runs["lenient"]["hedge"][0] + 0.5).all()
    assert (rare["accuracy max"] > 2 * rare["accuracy start"]).all()
    assert (rare["accuracy end"] < 0.5 * rare["accuracy max"]).all()


@pytest.mark.claim("C-RLVR-1", "confirmed")
def test_the_hack_spreads_through_the_shared_part(ev, seed):
    """Why the hedge wins: it is one output that the lenient checker pays on every question, so the shared part b
    collects its reward from all ten, while each correct digit is paid on one question and penalised on nine. Without
    the shared part (a separate table per question) accuracy does not collapse, though the hedge still gains mass;
    it falls only if the hedge starts with most of the mass (3 logits ahead). Would be refuted as a mechanism if the
    per-question policy collapsed as far as the shared one."""
    runs = train_arms(seed)
    names = ("lenient", "lenient, no shared part", "lenient, no shared part, hedge ahead")
    s = {n: summary(runs[n]) for n in names}
    for name in names[1:]:
        record_arm(ev, name, s[name], runs[name])
    ns, ahead = s["lenient, no shared part"], s["lenient, no shared part, hedge ahead"]
    ev.record("no shared part: accuracy at the end / at the start, per seed", fmt(ns["accuracy end"] / ns["accuracy start"]))
    ev.record("no shared part, hedge ahead: accuracy at the end / at the start, per seed",
              fmt(ahead["accuracy end"] / ahead["accuracy start"]))
    # THRESHOLDS, runs at seeds 100-139 (120 values): no shared part, end accuracy / start 5.5 ± 1.0 (min 2.9), over
    # the shared run's end accuracy 228 ± 85 (min 41), hedge gain 0.40 ± 0.11 (min 0.19); hedge 3 logits ahead,
    # end accuracy / start 0.17 ± 0.06 (max 0.39; 2 logits ahead gave 0.47 ± 0.21 with a max of 1.2, so no bound there)
    assert (ns["accuracy end"] > ns["accuracy start"]).all()
    assert (ns["accuracy end"] > 5 * s["lenient"]["accuracy end"]).all()
    assert (runs["lenient, no shared part"]["hedge"][-1] > runs["lenient, no shared part"]["hedge"][0]).all()
    assert (ahead["accuracy end"] < ahead["accuracy start"]).all()


@pytest.mark.claim("C-RLVR-1", "confirmed")
def test_a_kl_penalty_shrinks_the_fall_only_at_large_beta_and_never_stops_the_hedge(ev, seed):
    """The k3 penalty of GRPO's loss against the starting policy, β = 0.04 (DeepSeekMath's), 0.2 and 1, lenient
    checker. At β = 0.04 accuracy still falls far below its start before the penalty pulls it back; at β = 1 it
    never falls more than a few percent below its start, yet it ends well below the strict checker's at the same β,
    and the hedge ends with more probability than it started with at every β. What would change the page: accuracy
    falling at β = 1, or no fall at β = 0.04."""
    runs = train_arms(seed)
    names = ("lenient, beta 0.04", "lenient, beta 0.2", "lenient, beta 1", "strict, beta 1")
    s = {n: summary(runs[n]) for n in names}
    for name in names:
        record_arm(ev, name, s[name], runs[name])
        ev.record(f"{name}: first step with accuracy below half its start, per seed", fmt(s[name]["first step below half"]),
                  key=False)
    for name in names[:3]:
        ev.record(f"{name}: hedge probability, start and end (mean of 3 seeds)",
                  fmt(torch.stack([runs[name]["hedge"][0].mean(), runs[name]["hedge"][-1].mean()])))
    b04, b1, sb1 = s["lenient, beta 0.04"], s["lenient, beta 1"], s["strict, beta 1"]
    # THRESHOLDS, runs at seeds 100-139 (120 values): lowest accuracy / start at β = 0.04 0.18 ± 0.08 (max 0.52), at
    # β = 0.2 0.61 ± 0.17 (max 1: no bound), at β = 1 0.9999 ± 0.001 (min 0.988); strict minus lenient end accuracy
    # at β = 1 0.22 ± 0.03 (min 0.16); hedge gain at β = 0.04, 0.2, 1: 0.81, 0.40, 0.21 (mins 0.70, 0.27, 0.15)
    assert (b04["accuracy min"] < 0.7 * b04["accuracy start"]).all()
    assert (b1["accuracy min"] > 0.95 * b1["accuracy start"]).all()
    assert (b1["accuracy end"] < sb1["accuracy end"] - 0.1).all()
    for name in names[:3]:
        assert (runs[name]["hedge"][-1] > runs[name]["hedge"][0] + 0.05).all()
