# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% [markdown]
# # How does RLHF work, and what does each of its models do?
#
# Proofs for `docs/post-training/rlhf.md`. The losses are the shared ones in `proofs/post_training/objectives.py`
# (`bradley_terry_loss`, `kl_estimators`, `ppo_clip_objective`, `group_advantages`, `kl_shaped_rewards`); the
# networks are the shared `DecoderLM`. Four parts, all exact except part 2, which samples comparisons:
#
# 1. The reward model's loss sees only reward differences: adding c(x) to every reward of a prompt changes nothing.
# 2. Comparisons drawn from a known Bradley–Terry reward over 8 outputs: how well the fitted rewards recover the
#    truth as comparisons grow, and the accuracy ceiling that label noise puts on any reward model.
# 3. The four networks of PPO-RLHF and their bytes, counted on real tensors (tiny model) and by arithmetic (7B).
# 4. Where the KL penalty goes: in the reward (InstructGPT) or in the loss (GRPO), on a categorical policy.
# Run: `pytest proofs/post_training/proof_rlhf.py`.

# %%
from __future__ import annotations

import copy
import itertools
import math
from collections import Counter

import pytest
import torch
import torch.nn as nn

from proofs.post_training.objectives import (IGNORE, bradley_terry_loss, group_advantages, kl_estimators,
                                             kl_shaped_rewards, ppo_clip_objective, response_labels, sequence_logprob,
                                             token_logprobs)
from proofs.transformer import DecoderLM
from proofs.transformer.config import ConfigError
from proofs.transformer.presets import llama_config

F64 = torch.float64

# %% [markdown]
# ## 1. The reward model and the constant it cannot see
#
# InstructGPT's reward model is the SFT model with its unembedding removed and a scalar output (Ouyang et al. 2022,
# §3.5): here the shared `DecoderLM` with its head swapped for a `d_model → 1` linear map, read at the last
# position. Its loss, eq. 1, is −log σ(r(x, y_w) − r(x, y_l)) averaged over the K-choose-2 pairs of a prompt's K
# ranked outputs. Only differences of rewards of the *same* prompt enter, so any c(x) added to every reward of
# prompt x leaves the loss, and its gradient, unchanged: the reward model's level is never learned.

# %%
# --8<-- [start:rm]
def reward_model(cfg) -> DecoderLM:
    """The shared DecoderLM with its unembedding swapped for a scalar head (d_model -> 1, with a bias), as
    InstructGPT builds its RM from the SFT model (§3.5). The value model of PPO has the same shape."""
    model = DecoderLM(cfg)
    model.head = nn.Linear(cfg.d_model, 1)
    return model


def score(model: DecoderLM, ids: torch.Tensor) -> torch.Tensor:
    """One reward per sequence: the scalar head's output at the last position. ids (B, T) -> (B,)."""
    return model(ids)[:, -1, 0]


def ranked_pairs(rewards: torch.Tensor, ranking: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """All K-choose-2 (chosen, rejected) reward pairs of each prompt (eq. 1 takes them as one batch element).
    rewards (P, K); ranking (P, K): a permutation per prompt, best first. -> two (P, K(K-1)/2) tensors."""
    K = rewards.shape[1]
    a, b = zip(*itertools.combinations(range(K), 2))  # positions in the ranking: a is ranked above b
    w, l = ranking[:, list(a)], ranking[:, list(b)]
    return rewards.gather(1, w), rewards.gather(1, l)


def shift_invariance(seed: int, P: int = 4, K: int = 6) -> dict:
    """Eq. 1's loss under three changes of the rewards of P prompts with K ranked outputs each: c(x) added to every
    output of a prompt (invisible), c added to ONE output per prompt (the switch: visible), all rewards x 2 (visible:
    the loss fixes the scale). Also the gradient along the all-ones direction of each prompt."""
    g = torch.Generator().manual_seed(seed)
    r = torch.randn(P, K, generator=g, dtype=F64, requires_grad=True)
    ranking = torch.stack([torch.randperm(K, generator=g) for _ in range(P)])
    c = 10 * torch.randn(P, 1, generator=g, dtype=F64)  # a large per-prompt constant
    a = 0.5 + 4 * torch.rand(P, 1, generator=g, dtype=F64)  # a per-prompt scale in [0.5, 4.5)
    one = torch.zeros(P, K, dtype=F64)
    one[:, 0] = c[:, 0]  # the same constant on output 0 of each prompt only
    loss = bradley_terry_loss(*ranked_pairs(r, ranking))
    grad, = torch.autograd.grad(loss, r)  # (P, K)
    with torch.no_grad():
        shifted = bradley_terry_loss(*ranked_pairs(r + c, ranking))
        one_moved = bradley_terry_loss(*ranked_pairs(r + one, ranking))
        scaled = bradley_terry_loss(*ranked_pairs(2 * r, ranking))
    return {"loss": loss.item(), "shift c(x)": (shifted - loss).abs().item(),
            "shift one output": (one_moved - loss).abs().item(), "scale x2": (scaled - loss).abs().item(),
            "largest per-prompt sum of the gradient": grad.sum(1).abs().max().item(),
            "largest gradient on one output": grad.abs().max().item(),
            "group advantages change under c(x)": (group_advantages(r.detach() + c)
                                                   - group_advantages(r.detach())).abs().max().item(),
            # a per-prompt scale a(x) > 0 as well: GRPO's std division removes it (up to its eps = 1e-4 in the
            # denominator), Dr. GRPO's centring alone does not
            "GRPO advantages change under a(x)·r + c(x)": (group_advantages(a * r.detach() + c)
                                                           - group_advantages(r.detach())).abs().max().item(),
            "Dr. GRPO advantages under a(x)·r + c(x): largest |A after − a(x)·A before|": (
                group_advantages(a * r.detach() + c, scale="none")
                - a * group_advantages(r.detach(), scale="none")).abs().max().item(),  # (P, K) - (P, 1)·(P, K)
            "a(x) drawn, smallest and largest": [a.min().item(), a.max().item()]}


def head_bias_gradient(seed: int) -> dict:
    """The reward model's own head bias adds one constant to every reward: its gradient under eq. 1 is zero, while
    the head's weights (which can tell outputs apart) get a gradient. float64, random comparisons of 8 sequences."""
    torch.manual_seed(seed)
    cfg = llama_config(vocab_size=64, d_model=32, n_layers=2, n_heads=4, d_ff=96, max_len=64)
    rm = reward_model(cfg).double()
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, cfg.vocab_size, (8, 12), generator=g)  # 4 (chosen, rejected) pairs of sequences
    s = score(rm, ids)
    bradley_terry_loss(s[0::2], s[1::2]).backward()
    return {"head bias": rm.head.bias.grad.abs().item(), "head weight": rm.head.weight.grad.norm().item()}
# --8<-- [end:rm]


# %% [markdown]
# ## 2. Recovering a known reward from sampled comparisons
#
# Eight outputs of one prompt with true rewards r* ~ N(0, 1). A comparison picks a random pair (i, j) and a labeller
# who prefers i with probability σ(r*_i − r*_j), the Bradley–Terry model eq. 1 assumes. A reward table r (8 numbers)
# is fitted to n such comparisons by minimising eq. 1 (Newton's method in float64 on `bradley_terry_loss`, with a
# ridge of 0.01·‖r‖²/2 so that the optimum exists when a few comparisons happen to be all won by one side).
# Only r − mean(r) can be compared with the truth; its error should shrink like 1/√n.
#
# The **ceiling**: on a fresh comparison of i and j, a scorer that ranks i above j agrees with the label with
# probability σ(r*_i − r*_j). Averaged over pairs, the best any scorer can do is rank every pair like the truth,
# which scores mean σ(|r*_i − r*_j|): label noise caps a perfect reward model's accuracy below 1. Both the ceiling
# and a fitted table's expected accuracy are computed exactly over the 28 pairs, without sampling test labels.
# Two labellers of the same pair agree with probability p² + (1 − p)², p = σ(|Δr*|), which is at most p (their
# difference is (1 − p)(2p − 1) >= 0): inter-labeller agreement is a floor under the ceiling, not the ceiling.

# %%
# --8<-- [start:fit]
K_OUT, PAIR_COUNTS, REPLICAS, RIDGE = 8, (32, 128, 512, 2048), 8, 0.01
PAIRS = torch.tensor(list(itertools.combinations(range(K_OUT), 2)))  # (28, 2): every unordered pair


def sample_comparisons(r_true: torch.Tensor, n: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """n comparisons of uniformly random distinct pairs, each label drawn from Bradley–Terry: (winners, losers)."""
    i = torch.randint(0, K_OUT, (n,), generator=g)
    j = (i + torch.randint(1, K_OUT, (n,), generator=g)) % K_OUT  # j != i, uniform over the others
    i_wins = torch.rand(n, generator=g, dtype=F64) < torch.sigmoid(r_true[i] - r_true[j])
    return torch.where(i_wins, i, j), torch.where(i_wins, j, i)


def fit_reward_table(w: torch.Tensor, l: torch.Tensor, ridge: float = RIDGE) -> torch.Tensor:
    """argmin_r of n·eq.1 + ridge·‖r‖²/2 over a table r of K_OUT rewards: strictly convex, so Newton's method
    (gradient and Hessian by autograd of `bradley_terry_loss`, backtracking) converges to machine precision."""
    f = lambda r: bradley_terry_loss(r[w], r[l]) * len(w) + 0.5 * ridge * (r ** 2).sum()
    r = torch.zeros(K_OUT, dtype=F64)
    for _ in range(100):
        x = r.clone().requires_grad_(True)
        fx = f(x)
        g, = torch.autograd.grad(fx, x, create_graph=True)
        H = torch.stack([torch.autograd.grad(g[k], x, retain_graph=True)[0] for k in range(K_OUT)])
        step, t = torch.linalg.solve(H, g.detach()), 1.0
        while f(r - t * step) > fx.detach() and t > 1e-6:
            t /= 2
        r = r - t * step
        if step.abs().max() < 1e-9:
            return r
    raise RuntimeError("Newton's method did not converge")


def expected_accuracy(r_fit: torch.Tensor, r_true: torch.Tensor) -> float:
    """Exact probability that r_fit ranks a fresh comparison (uniform pair, Bradley–Terry label) like the labeller:
    σ(|Δr*|) where r_fit orders the pair like r*, 1 − σ(|Δr*|) where it does not, ½ on a tie."""
    d_true = r_true[PAIRS[:, 0]] - r_true[PAIRS[:, 1]]
    d_fit = r_fit[PAIRS[:, 0]] - r_fit[PAIRS[:, 1]]
    agree = torch.sign(d_fit) * torch.sign(d_true)  # +1, -1 or 0
    p = torch.sigmoid(d_true.abs())
    return (0.5 + agree * (p - 0.5)).mean().item()


def labeller_agreement(r_true: torch.Tensor) -> float:
    """Exact probability that two independent Bradley–Terry labels of a fresh comparison (uniform pair) agree:
    mean over pairs of p² + (1 − p)², p = σ(Δr*). Never above the ceiling mean σ(|Δr*|)."""
    p = torch.sigmoid(r_true[PAIRS[:, 0]] - r_true[PAIRS[:, 1]])
    return (p ** 2 + (1 - p) ** 2).mean().item()


def recovery(seed: int) -> dict:
    """For each pair count: mean over REPLICAS of the RMS error of centred rewards, the fitted scale (slope of the
    centred fit on the centred truth), the exact accuracy on fresh comparisons, the ceiling and the accuracy on the
    training comparisons themselves, and (the control) the true reward's accuracy on those same comparisons.
    rows["labels"]: two labellers' exact agreement and the ceiling, averaged over the draws of r*."""
    g = torch.Generator().manual_seed(seed)
    rows = {n: Counter() for n in PAIR_COUNTS}
    rows["labels"] = Counter()
    for _ in range(REPLICAS):
        r_true = torch.randn(K_OUT, generator=g, dtype=F64)
        rc = r_true - r_true.mean()
        rows["labels"]["agreement"] += labeller_agreement(r_true) / REPLICAS
        rows["labels"]["ceiling"] += expected_accuracy(r_true, r_true) / REPLICAS
        for n in PAIR_COUNTS:
            w, l = sample_comparisons(r_true, n, g)
            r_fit = fit_reward_table(w, l)
            fc = r_fit - r_fit.mean()
            rows[n]["error"] += ((fc - rc) ** 2).mean().sqrt().item() / REPLICAS
            rows[n]["slope"] += ((fc * rc).sum() / (rc * rc).sum()).item() / REPLICAS
            rows[n]["accuracy"] += expected_accuracy(r_fit, r_true) / REPLICAS
            rows[n]["ceiling"] += expected_accuracy(r_true, r_true) / REPLICAS
            rows[n]["train accuracy"] += (r_fit[w] > r_fit[l]).double().mean().item() / REPLICAS
            rows[n]["truth train accuracy"] += (r_true[w] > r_true[l]).double().mean().item() / REPLICAS
            rows[n]["max accuracy above ceiling"] = max(rows[n].get("max accuracy above ceiling", -1.0),
                                                        expected_accuracy(r_fit, r_true)
                                                        - expected_accuracy(r_true, r_true))
            rows[n]["ceiling by formula"] += torch.sigmoid((r_true[PAIRS[:, 0]] - r_true[PAIRS[:, 1]]).abs()
                                                           ).mean().item() / REPLICAS
    return rows
# --8<-- [end:fit]


# %% [markdown]
# ## 3. The four networks and their bytes
#
# PPO-RLHF keeps four networks (InstructGPT §3.5): the **policy** (trained), the **reference** π_SFT (frozen, for the
# KL penalty), the **reward model** (frozen, scores finished responses) and the **value model** (trained, initialised
# from the reward model; PPO's baseline). GRPO (Shao et al. 2024, §4.1.1) replaces the value model by the mean reward
# of a group of samples; DPO (Rafailov et al. 2023) needs no reward or value model, only the reference's
# log-probabilities of each preference pair, which can be computed once before training.
#
# Bytes per parameter, as on the training-memory page (`docs/scale/training-memory.md`): a trained network keeps
# 16 (mixed-precision Adam: 2 for 16-bit weights, 2 for gradients, 12 for the fp32 master copy and the two
# moments; ZeRO, Rajbhandari et al. 2020, arXiv §3.1 = Section III-A of the SC20 paper), a frozen one 2 (bf16
# weights, no gradient, no optimizer). The tiny model checks that arithmetic on real tensors: its trained networks
# take one real mixed-precision Adam step (bf16 weights and gradients, Adam on an fp32 master copy, 2 + 2 + 4 + 8 =
# 16 bytes per parameter), its frozen ones are cast to bf16. Not counted: activations, the KV cache of generation,
# a separate inference engine's copy of the policy, temporary buffers.

# %%
# --8<-- [start:memory]
TRAINED, FROZEN = 16, 2  # bytes per parameter: mixed-precision Adam (2 + 2 + 12), bf16 weights only
ALGORITHMS = {  # (trained networks, frozen networks)
    "SFT": (("policy",), ()),
    "PPO": (("policy", "value"), ("reference", "reward")),
    "GRPO, learned reward": (("policy",), ("reference", "reward")),
    "GRPO, rule-based reward": (("policy",), ("reference",)),
    "DPO, reference loaded": (("policy",), ("reference",)),
    "DPO, reference log-probs precomputed": (("policy",), ()),
}
TINY = dict(vocab_size=64, d_model=32, n_layers=2, n_heads=4, d_ff=96, max_len=64)
LLAMA_7B = dict(vocab_size=32000, d_model=4096, n_layers=32, n_heads=32, d_ff=11008)


def lm_params(vocab_size: int, d_model: int, n_layers: int, d_ff: int, **_) -> int:
    """Parameters of the shared model in LLaMA's configuration: per layer 4d² (attention) + 3·d·d_ff (SwiGLU) + 2d
    (two RMSNorm gains), an input embedding and an untied head of V·d each, a final norm d."""
    d = d_model
    return n_layers * (4 * d * d + 3 * d * d_ff + 2 * d) + 2 * vocab_size * d + d


def rm_params(vocab_size: int, d_model: int, **sizes) -> int:
    """The same backbone with the V·d head replaced by a scalar head (d weights + 1 bias)."""
    return lm_params(vocab_size, d_model, **sizes) - vocab_size * d_model + d_model + 1


def state_bytes(algo: str, n_policy: int, n_reward: int) -> dict:
    """Model-state bytes of an algorithm by arithmetic: TRAINED per trained parameter, FROZEN per frozen one."""
    size = {"policy": n_policy, "reference": n_policy, "reward": n_reward, "value": n_reward}
    trained, frozen = ALGORITHMS[algo]
    return {"trained": TRAINED * sum(size[m] for m in trained), "frozen": FROZEN * sum(size[m] for m in frozen)}


def rlhf_models(seed: int) -> dict:
    """The four networks on the tiny config: reference = a frozen copy of the policy (the SFT model), value = a copy
    of the reward model (InstructGPT initialises it from the RM)."""
    torch.manual_seed(seed)
    cfg = llama_config(**TINY)
    policy, reward = DecoderLM(cfg), reward_model(cfg)
    return {"policy": policy, "reference": copy.deepcopy(policy), "reward": reward, "value": copy.deepcopy(reward)}


def measured_bytes(algo: str, seed: int) -> dict:
    """Real tensors: one mixed-precision Adam step on each trained network (bf16 weights and gradients, an fp32
    master copy that Adam updates, so both fp32 moments exist, then copied back to bf16); frozen networks cast to
    bf16 without gradients. Sums nbytes of everything kept between steps (the fp32 gradient copy is transient)."""
    models, (trained, frozen) = rlhf_models(seed), ALGORITHMS[algo]
    ids = torch.randint(0, TINY["vocab_size"], (2, 8), generator=torch.Generator().manual_seed(seed))
    out = Counter()
    for name in trained:
        m = models[name].to(torch.bfloat16)  # the 16-bit working copy: forward and backward run in bf16
        master = [nn.Parameter(p.detach().float()) for p in m.parameters()]  # fp32 master weights
        opt = torch.optim.Adam(master, lr=1e-3)
        m(ids).float().square().mean().backward()  # any loss: what matters is that every parameter gets a gradient
        for mp, p in zip(master, m.parameters()):
            mp.grad = p.grad.float()  # upcast for the update only
        opt.step()
        with torch.no_grad():
            for mp, p in zip(master, m.parameters()):
                p.copy_(mp)  # the updated master, rounded back into the bf16 weights
                mp.grad = None
        out["trained weights (bf16)"] += sum(p.nbytes for p in m.parameters())
        out["gradients (bf16)"] += sum(p.grad.nbytes for p in m.parameters())
        out["fp32 master copy"] += sum(p.nbytes for p in master)
        for st in opt.state.values():  # exp_avg, exp_avg_sq (one per parameter) and a scalar step per tensor
            for key, t in st.items():
                out["Adam step counters" if key == "step" else "Adam moments (fp32)"] += t.nbytes
    for name in frozen:
        m = models[name].to(torch.bfloat16).requires_grad_(False)
        out["frozen weights (bf16)"] += sum(p.nbytes for p in m.parameters())
    out["params"] = {n: sum(p.numel() for p in models[n].parameters()) for n in models}
    return out
# --8<-- [end:memory]


# %% [markdown]
# ## 4. The KL penalty: in the reward or in the loss
#
# InstructGPT (eq. 2) subtracts β·log(π/π_SFT) from the reward, per token, so the penalty is part of the return that
# multiplies ∇log π (it enters through the advantage; `kl_shaped_rewards` detaches it). GRPO adds β·k3 to the loss,
# with k3 = π_ref/π − 1 − log(π_ref/π) (Shao et al. 2024, eq. 4), and differentiates it. On a categorical policy
# over 8 outputs (a one-token response) everything is exact in float64: the expectation over y ~ π is a sum
# weighted by π(y), detached as sampling would be.
#
# Penalty values: E_π[log π/π_ref] = E_π[k3] = KL(π‖π_ref), both estimators unbiased. Gradients (ascent direction
# of the objective): in the reward, E_π[−β log(π/π_ref)·∇log π] = −β∇KL(π‖π_ref), since E_π[∇log π] = 0; in the
# loss, −β E_π[(1 − π_ref/π)∇log π] = −β Σ_y (π − π_ref)∇log π = −β∇KL(π_ref‖π), the *other* direction. They
# agree to first order near π_ref (both KLs have the same curvature there) and part as π moves away.

# %%
# --8<-- [start:placement]
BETA, DRAWS = 0.1, 16


def categorical_pair(seed: int, near: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Policy logits θ and reference logits (8 outputs), N(0, 1) each; with `near`, θ = reference + near·N(0, 1)."""
    g = torch.Generator().manual_seed(seed)
    ref = torch.randn(K_OUT, generator=g, dtype=F64)
    theta = torch.randn(K_OUT, generator=g, dtype=F64)
    return (ref + near * theta if near is not None else theta), ref


def kl(p_logits: torch.Tensor, q_logits: torch.Tensor) -> torch.Tensor:
    """KL(p‖q) of two categoricals given by logits."""
    lp, lq = p_logits.log_softmax(-1), q_logits.log_softmax(-1)
    return (lp.exp() * (lp - lq)).sum()


def placements(theta0: torch.Tensor, ref_logits: torch.Tensor, beta: float = BETA) -> dict:
    """Expected penalty values and expected gradients (w.r.t. the logits) of the KL term placed in the reward
    (PPO-RLHF), in the loss as k3 (GRPO) and in the loss as k1, against the exact gradients of both KL directions."""
    theta = theta0.clone().requires_grad_(True)
    logp, logp_ref = theta.log_softmax(-1), ref_logits.log_softmax(-1)  # (K,): every output is one "response"
    weight = logp.exp().detach()  # π(y): the expectation over y ~ π, not differentiated (sampling)
    k = kl_estimators(logp, logp_ref)
    # in the reward: per-output reward −β·log(π/π_ref) (no RM score here), through PPO's surrogate at ratio 1
    shaped = kl_shaped_rewards(torch.zeros(K_OUT, dtype=F64), logp[:, None], logp_ref[:, None],
                               torch.ones(K_OUT, 1), beta)[:, 0]
    in_reward, = torch.autograd.grad((weight * ppo_clip_objective(logp, logp.detach(), shaped)).sum(), theta,
                                     retain_graph=True)
    in_loss_k3, = torch.autograd.grad(-(weight * beta * k["k3"]).sum(), theta, retain_graph=True)  # minus: ascent
    in_loss_k1, = torch.autograd.grad(-(weight * beta * k["k1"]).sum(), theta)
    t = theta0.clone().requires_grad_(True)
    reverse, = torch.autograd.grad(-beta * kl(t, ref_logits), t)  # −β∇KL(π‖π_ref)
    t = theta0.clone().requires_grad_(True)
    forward, = torch.autograd.grad(-beta * kl(ref_logits, t), t)  # −β∇KL(π_ref‖π)
    return {"KL(pi||ref)": kl(theta0, ref_logits).item(), "E[k1]": (weight * k["k1"]).sum().item(),
            "E[k3]": (weight * k["k3"]).sum().item(), "E[-shaped reward]/beta": -(weight * shaped).sum().item() / beta,
            "in reward": in_reward, "in loss (k3)": in_loss_k3, "in loss (k1)": in_loss_k1,
            "-beta grad KL(pi||ref)": reverse, "-beta grad KL(ref||pi)": forward}


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm()).item()


def per_token_identity(seed: int, beta: float = BETA) -> dict:
    """On the shared model (float64): a prompt + response sequence, a policy and a perturbed copy as reference. The
    per-token rewards summed over the response equal eq. 2's r(x, y) − β·log π(y|x)/π_ref(y|x); the prompt gets 0."""
    torch.manual_seed(seed)
    cfg = llama_config(**TINY)
    policy = DecoderLM(cfg).double()
    ref = copy.deepcopy(policy)
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(0.05 * torch.randn_like(p))
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, cfg.vocab_size, (3, 10), generator=g)  # 3 sequences: 4 prompt tokens + 6 response tokens
    labels = response_labels(ids, 4)  # (3, 9): IGNORE where a prompt token is predicted
    with torch.no_grad():
        lp, lp_ref = policy(ids[:, :-1]), ref(ids[:, :-1])
    logp, logp_ref = token_logprobs(lp, labels), token_logprobs(lp_ref, labels)
    rm_score = torch.randn(3, generator=g, dtype=F64)
    rewards = kl_shaped_rewards(rm_score, logp, logp_ref, labels != IGNORE, beta)
    eq2 = rm_score - beta * (sequence_logprob(lp, labels) - sequence_logprob(lp_ref, labels))
    return {"largest error of the summed rewards against eq. 2": (rewards.sum(1) - eq2).abs().max().item(),
            "largest reward on a prompt position": rewards[labels == IGNORE].abs().max().item(),
            "sequence log-ratio": (sequence_logprob(lp, labels) - sequence_logprob(lp_ref, labels)).tolist()}
# --8<-- [end:placement]


# %% [markdown]
# ## The tests

# %%
@pytest.mark.claim("C-RM-1", "confirmed")
def test_bradley_terry_loss_cannot_see_a_per_prompt_constant(ev, seed):
    """An identity, checked in float64: adding c(x) (sd 10) to every reward of a prompt leaves eq. 1's loss
    unchanged, and its gradient along the all-ones direction of each prompt is zero; on the shared-model reward
    model the head bias, which adds one constant to every reward, gets zero gradient. The switch: the same constant
    on one output per prompt changes the loss, and so does doubling every reward (the loss fixes the scale, not
    only the order). GRPO's group advantages drop c(x) too, and a per-prompt scale a(x) > 0 (its std division), while
    Dr. GRPO's scale with a(x). Would be refuted if a per-prompt shift moved the loss, or if GRPO's advantages moved
    under a(x)·r + c(x) beyond its eps's share (1e-4 against stds near 1)."""
    r = shift_invariance(seed)
    b = head_bias_gradient(seed)
    for key, v in r.items():
        ev.record(key if key != "loss" else "loss on random rewards", v, key=not key.startswith("a(x) drawn"),
                  expect={"shift c(x)": "0 (identity)", "shift one output": "> 0 (the switch)",
                          "scale x2": "> 0: the scale is fixed"}.get(key, ""))
    ev.record("reward model (shared DecoderLM): gradient of the head bias, absolute", b["head bias"], expect="0")
    ev.record("reward model: gradient norm of the head weights", b["head weight"], expect="> 0")
    assert r["shift c(x)"] < 1e-12 and r["largest per-prompt sum of the gradient"] < 1e-12
    assert r["group advantages change under c(x)"] < 1e-9
    # GRPO's eps = 1e-4 in std + eps makes the scale invariance approximate: |ΔA| ≤ |A|·1e-4·|1/std − 1/(a·std)| ≪ 1e-2
    assert r["GRPO advantages change under a(x)·r + c(x)"] < 1e-2
    assert r["Dr. GRPO advantages under a(x)·r + c(x): largest |A after − a(x)·A before|"] < 1e-9  # scaled by a(x)
    assert b["head bias"] < 1e-12 < 1e-6 < b["head weight"]
    # THRESHOLDS from seeds 100-139 (40 seeds): loss change when one output per prompt moves 1.08 ± 0.80 (min 0.106),
    # when every reward doubles 0.43 ± 0.16 (min 0.106); the identity's change is at most 3.3e-16. Both switches are
    # non-negative and skewed, so the bound is set by orders of magnitude: 1e-6 is 5 decades below the smallest seen
    assert r["shift one output"] > 1e-6 and r["scale x2"] > 1e-6
    assert r["largest gradient on one output"] > 1e-6  # 0.067 ± 0.008 (min 0.053)


@pytest.mark.claim("C-RM-1", "confirmed")
def test_fitted_rewards_approach_the_truth_and_never_beat_the_ceiling(ev, seed):
    """Comparisons sampled from a known Bradley–Terry reward over 8 outputs (8 draws of r* per pair count): the RMS
    error of the fitted r − mean(r) against the truth shrinks about as 1/√n from 32 to 2048 comparisons, the fitted
    scale approaches the true one (slope → 1), and the exact accuracy on fresh comparisons approaches, but never
    exceeds, the ceiling mean σ(|Δr*|) that label noise sets; on its own training comparisons a small-n fit scores
    above its fresh accuracy, by more than the true reward does on the same comparisons (the control). Two labellers
    agree less often than the ceiling (a theorem: p² + (1 − p)² <= p for p >= ½), so inter-labeller agreement is not
    the ceiling. Would be refuted if the error did not fall with n, or if a fit beat the ceiling."""
    rows = recovery(seed)
    labels = rows.pop("labels")
    for n, m in rows.items():
        ev.record(f"n = {n}: RMS error of centred rewards", m["error"], key=n in (32, 2048))
        ev.record(f"n = {n}: fitted scale (slope on the truth)", m["slope"], key=n == 2048)
        ev.record(f"n = {n}: accuracy on fresh comparisons, ceiling", [round(m["accuracy"], 4), round(m["ceiling"], 4)],
                  key=n in (32, 2048))
        ev.record(f"n = {n}: accuracy on its own training comparisons", m["train accuracy"], key=False)
    e = [rows[n]["error"] for n in PAIR_COUNTS]
    ev.record("RMS error x sqrt(n), n = 32 ... 2048", [round(x * math.sqrt(n), 2) for x, n in zip(e, PAIR_COUNTS)])
    ev.record("error ratio n = 512 / n = 2048", e[2] / e[3], expect="≈ 2 = sqrt(4)")
    ev.record("largest accuracy above the ceiling, any fit", max(m["max accuracy above ceiling"] for m in rows.values()),
              expect="<= 0 (a theorem)")
    ev.record("ceiling: exact pair sum vs mean σ(|Δr*|)",
              abs(rows[2048]["ceiling"] - rows[2048]["ceiling by formula"]), expect="0")
    gap, overfit = rows[2048]["ceiling"] - rows[2048]["accuracy"], rows[32]["train accuracy"] - rows[32]["accuracy"]
    truth_gap = rows[32]["truth train accuracy"] - rows[32]["ceiling"]  # the control: no fitting, same comparisons
    ev.record("n = 2048: ceiling minus accuracy on fresh comparisons", gap, expect="small, >= 0")
    ev.record("n = 32: accuracy on its own comparisons minus on fresh ones", overfit, expect="> 0")
    ev.record("n = 32, control: the true reward's accuracy on the same comparisons minus the ceiling", truth_gap,
              expect="≈ 0")
    ev.record("n = 32: the fit's excess minus the control's", overfit - truth_gap, expect="> 0")
    ev.record("two labellers agree (exact), ceiling", [round(labels["agreement"], 4), round(labels["ceiling"], 4)],
              expect="agreement < ceiling")
    ev.record("ceiling minus two labellers' agreement", labels["ceiling"] - labels["agreement"], expect="> 0 (theorem)")
    # exact: no fit beats the ceiling, the ceiling is the formula, two labellers agree less often than the ceiling
    assert all(m["max accuracy above ceiling"] <= 1e-12 for m in rows.values())
    assert abs(rows[2048]["ceiling"] - rows[2048]["ceiling by formula"]) < 1e-12
    assert labels["agreement"] < labels["ceiling"]
    # THRESHOLDS from seeds 100-139 (40 seeds, 8 draws of r* each): RMS error n = 32: 1.42 ± 0.28 (min 0.92),
    # 128: 0.416 ± 0.058 (max 0.60), 512: 0.179 ± 0.015 (min 0.143, max 0.208), 2048: 0.090 ± 0.009 (max 0.114), so
    # the order never ties; error ratio 512/2048: 2.01 ± 0.23 (min 1.57, max 2.40; 1/√n predicts 2); slope at 2048:
    # 1.003 ± 0.020 (min 0.962, max 1.042); ceiling − accuracy at 2048: 0.0012 ± 0.0006 (max 0.0027); training minus
    # fresh accuracy at n = 32: 0.132 ± 0.031 (min 0.059); the control (true reward on the same comparisons minus
    # the ceiling) −0.002 ± 0.028 (min −0.061, max 0.047); fit's excess minus the control's 0.134 ± 0.035 (min 0.065)
    assert e[0] > e[1] > e[2] > e[3]
    assert 1.2 < e[2] / e[3] < 2.9  # 3.5 sd below and 3.8 sd above the mean: between "no gain" (1) and 1/n (4)
    assert abs(rows[2048]["slope"] - 1) < 0.1  # 5 sd: the fitted rewards have the true scale, not only the order
    assert gap < 0.005 and overfit > 0.01  # 6.5 sd above the mean gap; 3.9 sd below the mean over-fit
    assert overfit - truth_gap > 0.01  # 3.6 sd below the mean: the excess is the fit's, not luck of the comparisons


@pytest.mark.claim("C-RLHF-1", "confirmed")
def test_four_networks_and_their_bytes(ev, seed):
    """Counts, not measurements of an effect. On the tiny shared model the bytes read from real tensors (one
    mixed-precision Adam step on the trained networks: bf16 weights and gradients, fp32 master copy and moments; bf16
    frozen ones) equal the arithmetic 2 + 2 + 4 + 8 = 16 per trained and 2 per frozen
    parameter, for every algorithm; the same arithmetic for a LLaMA-7B-sized policy with a same-sized reward and value
    model gives PPO > GRPO > DPO, and shows that the four networks are not four times SFT's memory: the trained value
    model costs eight times the frozen reward model. The fp32 master copy is made by this test itself; what the real
    tensors check is the rest, e.g. torch's Adam keeping two fp32 moments per parameter: would be refuted if its
    state held another number of them."""
    for algo in ALGORITHMS:
        m = measured_bytes(algo, seed)
        p = m["params"]
        assert p["reference"] == p["policy"] == lm_params(**TINY) and p["value"] == p["reward"] == rm_params(**TINY)
        a = state_bytes(algo, p["policy"], p["reward"])
        parts = [m[k] for k in ("trained weights (bf16)", "gradients (bf16)", "fp32 master copy", "Adam moments (fp32)")]
        ev.record(f"tiny, {algo}: bytes from tensors (trained, frozen) / arithmetic",
                  [sum(parts), m["frozen weights (bf16)"], a["trained"], a["frozen"]], key=algo == "PPO")
        n_trained = sum(p[k] for k in ALGORITHMS[algo][0])
        assert parts == [2 * n_trained, 2 * n_trained, 4 * n_trained, 8 * n_trained]  # ZeRO's 2 + 2 + (4 + 4 + 4)
        assert sum(parts) == a["trained"] and m["frozen weights (bf16)"] == a["frozen"]
    ev.record("tiny, PPO: trained bytes per parameter: bf16 weights, bf16 gradients, fp32 master, fp32 moments",
              [x / n_trained for x in parts])
    ev.record("tiny: parameters of policy, reference, reward, value", list(p.values()))
    ev.record("tiny, PPO: Adam step counters (4 bytes per tensor, not per parameter)", m["Adam step counters"],
              key=False)
    P, R = lm_params(**LLAMA_7B), rm_params(**LLAMA_7B)
    assert P == 6_738_415_616  # LLaMA-7B, as counted on the meta device in proofs/blocks/proof_param_count.py
    gb = {algo: sum(state_bytes(algo, P, R).values()) / 1e9 for algo in ALGORITHMS}
    ev.record("7B policy: parameters of policy, reward model", [P, R])
    for algo, v in gb.items():
        ev.record(f"7B: {algo} (GB)", v)
    ev.record("7B: PPO / SFT", gb["PPO"] / gb["SFT"], expect="≈ 2.2, not 4")
    ev.record("7B: value model's share of PPO", TRAINED * R / 1e9 / gb["PPO"])
    big, small = 175e9, 6e9  # InstructGPT: 175B policy, 6B reward model and value function (§3.5)
    ppo_instruct = (TRAINED + FROZEN) * big + (TRAINED + FROZEN) * small
    ev.record("InstructGPT sizes (175B policy, 6B RM and value), same bytes per parameter: PPO (GB), value share",
              [ppo_instruct / 1e9, round(TRAINED * small / ppo_instruct, 4)])
    assert gb["PPO"] > gb["GRPO, learned reward"] > gb["GRPO, rule-based reward"] > gb["DPO, reference log-probs precomputed"]
    assert gb["GRPO, rule-based reward"] == gb["DPO, reference loaded"] and gb["DPO, reference log-probs precomputed"] == gb["SFT"]
    assert sum(state_bytes("PPO", P, R).values()) - sum(state_bytes("GRPO, learned reward", P, R).values()) == TRAINED * R
    assert 2 < gb["PPO"] / gb["SFT"] < 2.5


@pytest.mark.claim("C-RLHF-1", "confirmed")
def test_kl_in_the_reward_and_in_the_loss_same_penalty_different_gradient(ev, seed):
    """Exact in float64 on a categorical policy over 8 outputs, for 16 random (policy, reference) pairs far apart and
    16 near each other: the penalty in the reward (InstructGPT eq. 2, through PPO's surrogate) and k3 in the loss
    (GRPO eq. 4) have the same expected value KL(π‖π_ref), but their expected gradients are those of KL(π‖π_ref)
    and of KL(π_ref‖π) respectively; k1 in the loss has zero expected gradient. Near π_ref the two gradients nearly
    agree, far from it they differ. On the shared model the per-token rewards sum to eq. 2's sequence-level
    r − β·log(π/π_ref). Would be refuted if the two placements gave the same gradient far from the reference, or if
    either differed from its KL's exact gradient."""
    runs = {name: [placements(*categorical_pair(seed * 100 + i, near=near)) for i in range(DRAWS)]
            for name, near in (("far", None), ("near", 0.05))}
    worst = Counter()
    for name, rs in runs.items():
        r = rs[0]
        ev.record(f"{name}, first draw: KL(π‖π_ref), E[k1], E[k3]",
                  [round(r[k], 6) for k in ("KL(pi||ref)", "E[k1]", "E[k3]")], expect="all equal")
        diffs = [rel(r["in loss (k3)"], r["in reward"]) for r in rs]
        cosines = [torch.nn.functional.cosine_similarity(r["in loss (k3)"], r["in reward"], dim=0).item() for r in rs]
        ev.record(f"{name}: relative difference of the two placements' gradients, mean over {DRAWS} draws",
                  sum(diffs) / DRAWS)
        ev.record(f"{name}: cosine of the two gradients, smallest of {DRAWS} draws", min(cosines))
        for r in rs:
            worst["penalty values"] = max(worst["penalty values"], *(abs(r[k] - r["KL(pi||ref)"])
                                                                     for k in ("E[k1]", "E[k3]", "E[-shaped reward]/beta")))
            worst["in reward vs reverse-KL gradient"] = max(worst["in reward vs reverse-KL gradient"],
                                                            rel(r["in reward"], r["-beta grad KL(pi||ref)"]))
            worst["k3 in loss vs forward-KL gradient"] = max(worst["k3 in loss vs forward-KL gradient"],
                                                             rel(r["in loss (k3)"], r["-beta grad KL(ref||pi)"]))
            worst["k1 in loss, gradient norm"] = max(worst["k1 in loss, gradient norm"], r["in loss (k1)"].norm().item())
    for key, v in worst.items():
        ev.record(f"largest error, all draws: {key}", v, expect="0 (identity)", key=False)
    tok = per_token_identity(seed)
    for key, v in tok.items():
        ev.record(f"shared model, per-token rewards: {key}", v, key=False)
    assert worst["penalty values"] < 1e-12 and worst["k1 in loss, gradient norm"] < 1e-14
    assert worst["in reward vs reverse-KL gradient"] < 1e-10 and worst["k3 in loss vs forward-KL gradient"] < 1e-10
    assert tok["largest error of the summed rewards against eq. 2"] < 1e-12 and tok["largest reward on a prompt position"] == 0
    far = sum(rel(r["in loss (k3)"], r["in reward"]) for r in runs["far"]) / DRAWS
    near = sum(rel(r["in loss (k3)"], r["in reward"]) for r in runs["near"]) / DRAWS
    # THRESHOLDS from seeds 100-139 (40 seeds, 16 draws each): far 0.625 ± 0.085 (min 0.489), near 0.0245 ± 0.0029
    # (max 0.030); the smallest cosine among a seed's far draws 0.61 ± 0.11 (min 0.35)
    assert far > 0.25 and near < 0.04  # 4.4 sd below and 5.4 sd above the means


def test_bad_settings_raise_config_error(ev):
    """kl_shaped_rewards: a negative β, a score per token instead of per output, an output with no response token
    each raise ConfigError naming the fix."""
    logp = torch.zeros(2, 3)
    cases = {"beta = -0.1": (torch.zeros(2), torch.ones(2, 3), -0.1, "beta"),
             "score of shape (2, 3)": (torch.zeros(2, 3), torch.ones(2, 3), 0.1, "one reward-model score per output"),
             "an output with no response token": (torch.zeros(2), torch.tensor([[1, 1, 0], [0, 0, 0]]), 0.1,
                                                  "at least one response token")}
    for name, (score_, mask, beta, match) in cases.items():
        with pytest.raises(ConfigError, match=match) as err:
            kl_shaped_rewards(score_, logp, logp, mask, beta=beta)
        ev.record(f"kl_shaped_rewards, {name}", str(err.value), key=False)
