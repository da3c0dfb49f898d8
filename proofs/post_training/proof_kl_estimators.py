# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% [markdown]
# # Which KL estimator, and why does it matter as a loss?
#
# Proofs for `docs/post-training/kl-estimators.md`. The estimators are the shared ones, `kl_estimators` in
# `proofs/post_training/objectives.py`: with log r = log π_ref(y) − log π(y) for a sample y ~ π,
# k1 = −log r, k2 = ½(log r)², k3 = (r − 1) − log r (Schulman 2020; k3 is GRPO's, Shao et al. 2024, eq. 4).
# The policy is a categorical over K = 8 outputs with its logits as the parameters, in float64, so every
# expectation over y ~ π is a finite sum computed exactly.
#
# 1. As estimates of the value KL(π‖π_ref): exact means and variances, then 20,000 draws against them.
# 2. As losses: the expected autograd gradient of each estimator, with the sample detached (it came from π, and
#    autograd cannot see how it was drawn), against the exact gradients of KL(π‖π_ref) and KL(π_ref‖π).
# 3. What each one optimises: gradient descent on "reward − β·estimator" lands on a different policy per estimator.
# Parts 1 and 2 are exact (identities, checked to float64 round-off) apart from their sampled checks, whose
# thresholds are z-scores (the spread over seeds 100-139 is written beside each assert). Part 3 is deterministic.
# Run: `pytest proofs/post_training/proof_kl_estimators.py`.

# %%
from __future__ import annotations

import pytest
import torch

from proofs.post_training.objectives import kl_estimators, kl_regularised_optimum

F64 = torch.float64
K, PAIRS, NAMES = 8, 16, ("k1", "k2", "k3")

# %% [markdown]
# ## The two policies
#
# Each seed draws a reference π_ref = softmax(z_ref) and two policies: a *near* one, z_ref plus small noise (the
# regime right after a few RL steps), and a *far* one with its own logits (a policy that has drifted). The KL in
# both directions is a finite sum.

# %%
# --8<-- [start:pairs]
def policy_pairs(seed: int, n: int = PAIRS) -> dict[str, list[tuple[torch.Tensor, torch.Tensor]]]:
    """n (policy logits, reference logits) pairs of each kind: near = reference + N(0, 0.2²) noise on every logit,
    far = independent N(0, 1.5²) logits."""
    g = torch.Generator().manual_seed(seed)
    out = {"near": [], "far": []}
    for _ in range(n):
        z_ref = torch.randn(K, generator=g, dtype=F64)
        out["near"].append((z_ref + 0.2 * torch.randn(K, generator=g, dtype=F64), z_ref))
        out["far"].append((1.5 * torch.randn(K, generator=g, dtype=F64), z_ref))
    return out


def kl(p_logits: torch.Tensor, q_logits: torch.Tensor) -> torch.Tensor:
    """KL(p‖q) = Σ_y p(y) log p(y)/q(y) for logits, exactly (a sum over the K outputs); differentiable in both."""
    lp, lq = p_logits.log_softmax(-1), q_logits.log_softmax(-1)
    return (lp.exp() * (lp - lq)).sum(-1)
# --8<-- [end:pairs]


# %% [markdown]
# ## 1. As estimates of KL(π‖π_ref)
#
# For samples y ~ π, E_π[k1] = Σ π log(π/π_ref) = KL(π‖π_ref) by definition, and E_π[r] = Σ π·π_ref/π = 1, so
# E_π[k3] = E_π[r] − 1 + E_π[k1] = KL(π‖π_ref): both unbiased (identities). k2 = ½(log r)² is a different
# f-divergence that agrees with KL to second order around π = π_ref, so it is biased, a little when the policies are
# near and more when far. Two more identities: k1 < 0 exactly on the outputs with π_ref > π, which always carry some
# probability when π ≠ π_ref (both sum to 1); and k3 = x − 1 − log x with x = r is ≥ 0 for every x > 0. The exact
# values are then checked against 20,000 draws from π: each sample mean against its exact expectation, in units of its
# standard error.

# %%
# --8<-- [start:values]
def estimator_moments(z: torch.Tensor, z_ref: torch.Tensor) -> dict:
    """Exact E_π[k] and Var_π[k] of each estimator by enumerating the K outputs, the exact KL(π‖π_ref), and the
    probability that a single sample gives a negative k1 or k3."""
    logp, logp_ref = z.log_softmax(-1), z_ref.log_softmax(-1)
    pi = logp.exp()
    ks = kl_estimators(logp, logp_ref)                       # each (K,): the estimate if that output is drawn
    mean = {n: (pi * ks[n]).sum().item() for n in NAMES}
    var = {n: (pi * (ks[n] - mean[n]) ** 2).sum().item() for n in NAMES}
    neg = {n: pi[ks[n] < 0].sum().item() for n in NAMES}
    return {"kl": kl(z, z_ref).item(), "mean": mean, "var": var, "p(negative)": neg, "k3 min": ks["k3"].min().item()}


def sampled_means(z: torch.Tensor, z_ref: torch.Tensor, n: int, g: torch.Generator) -> dict:
    """n draws y ~ π: the sample mean of each estimator and its z-score against the exact expectation
    (sample mean − E)/sqrt(Var/n); also the sampled k2 against the true KL, and the share of negative k1 draws."""
    logp, logp_ref = z.log_softmax(-1), z_ref.log_softmax(-1)
    y = torch.multinomial(logp.exp(), n, replacement=True, generator=g)
    ks = kl_estimators(logp[y], logp_ref[y])                 # (n,) each: the estimates a sampler would log
    exact = estimator_moments(z, z_ref)
    se = {k: (exact["var"][k] / n) ** 0.5 for k in NAMES}
    return {"mean": {k: ks[k].mean().item() for k in NAMES},
            "z": {k: (ks[k].mean().item() - exact["mean"][k]) / se[k] for k in NAMES},
            "k2 vs KL, in standard errors": (ks["k2"].mean().item() - exact["kl"]) / se["k2"],
            "negative k1 draws": (ks["k1"] < 0).float().mean().item()}
# --8<-- [end:values]


# %% [markdown]
# ## 2. As losses: what autograd does with each estimator
#
# In a GRPO-style loss the estimator is evaluated on sampled tokens and differentiated. The sample y came from π,
# but autograd sees only the number log π(y): the dependence of *which* y was drawn on the parameters is lost.
# So the expected gradient of "k as a loss" is E_{y~π}[∇k(y)] with the sampling distribution held fixed, which
# we compute exactly as Σ_y sg[π(y)]·∇k(y) (sg = detach): the weights are the sampling probabilities, treated as
# constants, and the gradient flows through log π(y) inside k only (log π_ref is a constant too). With
# ∇k1 = ∇log π, ∇k2 = log(π/π_ref)·∇log π and ∇k3 = (1 − π_ref/π)·∇log π:
#
# - E_π[∇k1] = Σ_y π ∇log π = ∇Σ_y π = 0: k1 as a loss does nothing, in expectation;
# - E_π[∇k2] = Σ_y π log(π/π_ref) ∇log π = ∇KL(π‖π_ref) (the score-function form of the true gradient);
# - E_π[∇k3] = Σ_y (π − π_ref) ∇log π = −Σ_y π_ref ∇log π = ∇KL(π_ref‖π), the other direction.
#
# For logits z these are 0, π ⊙ (log(π/π_ref) − KL(π‖π_ref)) and π − π_ref. The switch is the detach: differentiate
# the exact expectation Σ_y π(y)·k(y) *through* π as well and k1 and k3 both give ∇KL(π‖π_ref), because their
# expectations are that KL as functions of the parameters. The sampled version of the right gradient is the
# score-function one, sg[k1]·∇log π ("k1 in the reward"), whose expectation is also computed.

# %%
# --8<-- [start:gradients]
def expected_loss_gradients(z0: torch.Tensor, z_ref: torch.Tensor) -> dict[str, torch.Tensor]:
    """Gradients w.r.t. the logits, exactly, for a policy softmax(z0) and a fixed reference:
    'k as loss'      Σ_y sg[π(y)]·∇k(y)             (samples from π, detached: what autograd on a sampled loss gives)
    'k expectation'  ∇ Σ_y π(y)·k(y)                (the switch: the sampling distribution differentiated too)
    'k1 in reward'   Σ_y sg[π(y)]·sg[k1(y)]·∇log π(y) (the score-function estimator)
    and the exact gradients of both KL directions."""
    z = z0.clone().requires_grad_(True)
    logp, logp_ref = z.log_softmax(-1), z_ref.log_softmax(-1)
    pi, w = logp.exp(), logp.exp().detach()                 # w: the sampling probabilities, constants
    ks = kl_estimators(logp, logp_ref)
    grad = lambda f: torch.autograd.grad(f, z, retain_graph=True)[0]
    out = {f"{n} as loss": grad((w * ks[n]).sum()) for n in NAMES}
    out |= {f"{n} expectation": grad((pi * ks[n]).sum()) for n in NAMES}
    out["k1 in reward"] = grad((w * ks["k1"].detach() * logp).sum())
    out["grad KL(pi||ref)"] = grad(kl(z, z_ref))
    out["grad KL(ref||pi)"] = grad(kl(z_ref, z))
    p, q = pi.detach(), z_ref.softmax(-1)
    out["closed form: pi (log pi/ref - KL)"] = p * ((p / q).log() - (p * (p / q).log()).sum())
    out["closed form: pi - ref"] = p - q
    return out


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    """|a − b| / |b| (Euclidean norms)."""
    return ((a - b).norm() / b.norm()).item()


def sampled_loss_gradient(z0: torch.Tensor, z_ref: torch.Tensor, name: str, n: int, g: torch.Generator) -> dict:
    """The gradient a sampled batch gives: n draws y ~ π, autograd on mean_i k(y_i). Against the exact expectation,
    per logit, in units of the standard error sqrt(Var_π[∇k]/n) computed from the K per-output gradients."""
    z = z0.clone().requires_grad_(True)
    logp, logp_ref = z.log_softmax(-1), z_ref.log_softmax(-1)
    y = torch.multinomial(logp.detach().exp(), n, replacement=True, generator=g)
    sampled, = torch.autograd.grad(kl_estimators(logp[y], logp_ref[y])[name].mean(), z, retain_graph=True)
    per_output = torch.stack([torch.autograd.grad(kl_estimators(logp, logp_ref)[name][j], z, retain_graph=True)[0]
                              for j in range(K)])           # (K outputs, K logits): ∇k(y) for each possible y
    pi = logp.detach().exp()[:, None]
    mean = (pi * per_output).sum(0)
    se = ((pi * (per_output - mean) ** 2).sum(0) / n).sqrt()
    return {"sampled": sampled, "exact": mean, "max |z|": ((sampled - mean) / se).abs().max().item()}
# --8<-- [end:gradients]


# %% [markdown]
# ## 3. What each one optimises
#
# Put each estimator where GRPO puts k3: maximise E_π[R] − β·(k as a loss), with a fixed reward R over the K
# outputs. The reward term is the exact policy gradient Σ_y π(y)(R(y) − E_π R)∇log π(y) (a REINFORCE surrogate with
# the sampling weights detached, as in part 2). Plain gradient descent on the logits, from π = π_ref, to
# convergence. The closed forms it is held against:
#
# - the KL(π‖π_ref)-regularised optimum, π*(y) ∝ π_ref(y)·exp(R(y)/β) (`kl_regularised_optimum`; Rafailov et al.
#   2023, eq. 4: the RLHF objective);
# - the KL(π_ref‖π)-regularised optimum: setting the gradient Σ_y π(R − E_π R)∇log π − β(π − π_ref) to zero on the
#   logits gives π(y)(R(y) − c) = β(π(y) − π_ref(y)) with c = E_π R, so π(y) = β·π_ref(y)/(β + c − R(y)), with the
#   constant c > max R − β found by bisection so that π sums to 1 (then c = E_π R holds by itself).

# %%
# --8<-- [start:optimise]
def reverse_kl_optimum(ref: torch.Tensor, reward: torch.Tensor, beta: float) -> torch.Tensor:
    """argmax_π E_π[R] − β·KL(π_ref‖π) over distributions on K outputs: π = β·π_ref/(β + c − R), c by bisection."""
    lo, hi = reward.max().item() - beta, reward.max().item() + 1.0 / ref.min().item() + 1.0
    for _ in range(200):
        c = (lo + hi) / 2
        lo, hi = (c, hi) if (beta * ref / (beta + c - reward)).sum() > 1 else (lo, c)
    p = beta * ref / (beta + (lo + hi) / 2 - reward)
    return p / p.sum()


ARMS = ("no penalty", "k1", "k2", "k3")


def optimise_with_each_penalty(z_ref: torch.Tensor, reward: torch.Tensor, beta: float, lr: float = 8.0,
                               steps: int = 400) -> torch.Tensor:
    """(4, K) policies after gradient descent on −E_π[R] + β·Σ_y sg[π(y)]·k(y), one row per arm, from π = π_ref.
    Every expectation is exact (a sum over the K outputs weighted by the detached π)."""
    z = z_ref.expand(len(ARMS), K).clone()
    logp_ref = z_ref.log_softmax(-1).expand(len(ARMS), K)
    for _ in range(steps):
        z.requires_grad_(True)
        logp = z.log_softmax(-1)
        w = logp.detach().exp()
        policy_gradient = -(w * (reward - (w * reward).sum(-1, keepdim=True)) * logp).sum()
        ks = kl_estimators(logp, logp_ref)
        penalty = sum((w[i] * ks[arm][i]).sum() for i, arm in enumerate(ARMS) if arm != "no penalty")
        g, = torch.autograd.grad(policy_gradient + beta * penalty, z)
        z = (z - lr * g).detach()
    return z.softmax(-1)


def tv(p: torch.Tensor, q: torch.Tensor) -> float:
    return 0.5 * (p - q).abs().sum().item()


def where_each_penalty_leads(seed: int, beta: float = 0.3) -> dict:
    g = torch.Generator().manual_seed(seed)
    while True:  # precondition: the two optima must be told apart; a draw with them < 0.01 apart in TV is redrawn
        z_ref = torch.randn(K, generator=g, dtype=F64)   # (of seeds 0-2999 only seed 2712 is: 0.0027)
        reward = torch.rand(K, generator=g, dtype=F64)
        ref = z_ref.softmax(-1)
        rev, fwd = kl_regularised_optimum(ref, reward, beta), reverse_kl_optimum(ref, reward, beta)
        if tv(rev, fwd) >= 0.01:
            break
    pis = optimise_with_each_penalty(z_ref, reward, beta)
    out = {"TV between the two optima": tv(rev, fwd), "KL(pi||ref) of the RLHF optimum": (rev * (rev / ref).log()).sum().item()}
    for i, arm in enumerate(ARMS):
        p = pis[i]
        out[arm] = {"TV to KL(pi||ref) optimum": tv(p, rev), "TV to KL(ref||pi) optimum": tv(p, fwd),
                    "KL(pi||ref)": (p * (p / ref).log()).sum().item(), "E[R]": (p * reward).sum().item()}
    out["k1 minus no penalty, max |dp|"] = (pis[1] - pis[0]).abs().max().item()
    return out
# --8<-- [end:optimise]


# %% [markdown]
# ## The tests

# %%
@pytest.mark.claim("C-KLEST-1", "confirmed")
def test_k1_and_k3_are_unbiased_k2_is_biased_k1_goes_negative_k3_never(ev, seed):
    """Exact over 16 near and 16 far policy pairs: E_π[k1] and E_π[k3] equal KL(π‖π_ref) to round-off (identities);
    E_π[k2] does not (its bias is reported, small near, large far); a single k1 is negative with the probability of the
    outputs where π_ref > π; k3 is never negative. Near the reference k3's variance is far below k1's; a far pair can
    reverse that. Then 20,000 draws: every sample mean within a few standard errors of its exact value (k2's distance
    from the true KL, in standard errors, is reported). Would be refuted if E[k1] or E[k3] missed the KL, if k3 were
    ever negative, or if k2 were unbiased."""
    pairs = policy_pairs(seed)
    worst = {"|E[k1] - KL|": 0.0, "|E[k3] - KL|": 0.0}
    for kind, rows in pairs.items():
        ms = [estimator_moments(z, z_ref) for z, z_ref in rows]
        for m in ms:
            worst["|E[k1] - KL|"] = max(worst["|E[k1] - KL|"], abs(m["mean"]["k1"] - m["kl"]))
            worst["|E[k3] - KL|"] = max(worst["|E[k3] - KL|"], abs(m["mean"]["k3"] - m["kl"]))
        bias = [m["mean"]["k2"] - m["kl"] for m in ms]
        rel_bias = [abs(b) / m["kl"] for b, m in zip(bias, ms)]
        ev.record(f"{kind}: KL(π‖π_ref), first pair", ms[0]["kl"])
        ev.record(f"{kind}: E[k1], E[k2], E[k3], first pair", [round(ms[0]["mean"][n], 6) for n in NAMES],
                  expect="k1 = k3 = KL, k2 off")
        ev.record(f"{kind}: k2 bias |E[k2] − KL| / KL, mean over {PAIRS} pairs", sum(rel_bias) / PAIRS)
        ev.record(f"{kind}: std of k1, k2, k3, first pair", [round(ms[0]["var"][n] ** 0.5, 5) for n in NAMES])
        ev.record(f"{kind}: pairs where Var[k3] < Var[k1]", f"{sum(m['var']['k3'] < m['var']['k1'] for m in ms)}/{PAIRS}")
        ev.record(f"{kind}: P(one k1 sample < 0), first pair", ms[0]["p(negative)"]["k1"])
        ev.record(f"{kind}: P(one k3 sample < 0), all pairs", max(m["p(negative)"]["k3"] for m in ms), expect="0")
        assert all(m["p(negative)"]["k1"] > 0 for m in ms)  # identity: some output has π_ref > π when π ≠ π_ref
        assert all(m["k3 min"] >= 0 for m in ms)             # identity: x − 1 − log x ≥ 0
        # k2 is biased: its bias is third order near the reference and can change sign, so a single pair can be
        # almost unbiased (seed 299 has a near pair at 1.7e-5); the mean over the 16 pairs cannot. Seeds 100-139:
        # near 0.036 ± 0.0074 (min 0.022), far 0.31 ± 0.071 (min 0.20)
        assert sum(rel_bias) / PAIRS > 0.01
        if kind == "near":  # second order: Var[k1] ~ δ², Var[k3] ~ δ⁴
            ratio = max(m["var"]["k3"] / m["var"]["k1"] for m in ms)
            ev.record("near: largest Var[k3] / Var[k1] over the 16 pairs", ratio)
            assert ratio < 0.5  # seeds 100-139: 0.044 ± 0.025, max 0.14
    for name, v in worst.items():
        ev.record(f"largest {name}, all 32 pairs", v, expect="< 1e-12")
        assert v < 1e-12
    grid = torch.logspace(-8, 8, 1601, dtype=F64)  # r from 1e-8 to 1e8: k3 over every ratio a sample could give
    k3_grid = kl_estimators(torch.zeros_like(grid), grid.log())["k3"]
    ev.record("min of k3 over r in [1e-8, 1e8]", k3_grid.min().item(), expect="0 (at r = 1)")
    assert k3_grid.min().item() >= 0
    # a far pair where k3 is the noisier estimator: π puts 1% on an output the reference gives 98%, so r = 98 there
    z, z_ref = torch.tensor([0.98, 0.01, 0.01], dtype=F64).log(), torch.tensor([0.01, 0.98, 0.01], dtype=F64).log()
    m = estimator_moments(z, z_ref)
    ev.record("π = (0.98, 0.01, 0.01), π_ref = (0.01, 0.98, 0.01): std of k1, k3", [round(m["var"][n] ** 0.5, 3)
                                                                                   for n in ("k1", "k3")])
    assert m["var"]["k3"] > m["var"]["k1"]
    g = torch.Generator().manual_seed(seed)
    for kind in ("near", "far"):
        s = sampled_means(*pairs[kind][0], 20_000, g)
        ev.record(f"{kind}, 20,000 draws: z-scores of the k1, k2, k3 sample means", [round(s["z"][n], 2) for n in NAMES],
                  expect="|z| < 5")
        ev.record(f"{kind}, 20,000 draws: share of negative k1", s["negative k1 draws"])
        ev.record(f"{kind}, 20,000 draws: sampled k2 minus KL, in standard errors", s["k2 vs KL, in standard errors"])
        # THRESHOLD: a correct sampler gives z ~ N(0, 1); seeds 100-139: 240 z-scores, sd 0.91, largest |z| 2.7
        assert max(abs(v) for v in s["z"].values()) < 5


@pytest.mark.claim("C-KLEST-1", "confirmed")
@pytest.mark.claim("C-FOLK-27", "refuted")
def test_as_losses_k1_gives_zero_k2_the_reverse_kl_k3_the_forward_kl_gradient(ev, seed):
    """Exact, on 16 near and 16 far pairs: the expected autograd gradient of each estimator used as a loss (samples
    from π, sampling weights detached, gradient through log π only) is 0 for k1, ∇KL(π‖π_ref) for k2 and ∇KL(π_ref‖π)
    for k3, each equal to autograd on the exact KL and to the closed form to round-off. The switch: differentiating the
    expectation through π too, k1 and k3 both give ∇KL(π‖π_ref), as does the score-function 'k1 in the reward'. k3's
    gradient is close to the right one near the reference and far from it on a drifted policy. Then 4,000 sampled
    draws: autograd on the batch mean lands within a few standard errors of the exact expectation. C-FOLK-27 would
    stand if k3 as a loss gave ∇KL(π‖π_ref); C-KLEST-1 would fall if any of the three identities failed."""
    pairs = policy_pairs(seed)
    checks = {  # (measured, reference) per identity: all must hold to round-off
        "k1 as loss = 0": ("k1 as loss", None),
        "k2 as loss = grad KL(π‖π_ref)": ("k2 as loss", "grad KL(pi||ref)"),
        "k3 as loss = grad KL(π_ref‖π)": ("k3 as loss", "grad KL(ref||pi)"),
        "grad KL(π‖π_ref) = closed form": ("grad KL(pi||ref)", "closed form: pi (log pi/ref - KL)"),
        "grad KL(π_ref‖π) = π − π_ref": ("grad KL(ref||pi)", "closed form: pi - ref"),
        "switch: k1 expectation = grad KL(π‖π_ref)": ("k1 expectation", "grad KL(pi||ref)"),
        "switch: k3 expectation = grad KL(π‖π_ref)": ("k3 expectation", "grad KL(pi||ref)"),
        "k1 in reward = grad KL(π‖π_ref)": ("k1 in reward", "grad KL(pi||ref)"),
    }
    worst = dict.fromkeys(checks, 0.0)
    gap = {"near": [], "far": []}
    cos = {"near": [], "far": []}
    for kind, rows in pairs.items():
        for z, z_ref in rows:
            gr = expected_loss_gradients(z, z_ref)
            for name, (a, b) in checks.items():
                err = gr[a].norm().item() / gr["grad KL(pi||ref)"].norm().item() if b is None else rel(gr[a], gr[b])
                worst[name] = max(worst[name], err)
            gap[kind].append(rel(gr["k3 as loss"], gr["grad KL(pi||ref)"]))
            cos[kind].append(torch.nn.functional.cosine_similarity(gr["k3 as loss"], gr["grad KL(pi||ref)"], 0).item())
    for name, v in worst.items():
        ev.record(f"largest relative error, 32 pairs: {name}", v, expect="< 1e-10")
        assert v < 1e-10
    for kind in ("near", "far"):
        ev.record(f"{kind}: |k3-loss gradient − grad KL(π‖π_ref)| / |grad KL(π‖π_ref)|, mean of {PAIRS}",
                  sum(gap[kind]) / PAIRS)
        ev.record(f"{kind}: cosine(k3-loss gradient, grad KL(π‖π_ref)), smallest of {PAIRS}", min(cos[kind]))
    # seeds 100-139, mean relative gap: near 0.097 ± 0.013 (max 0.13), far 0.83 ± 0.14 (min 0.55)
    assert sum(gap["near"]) / PAIRS < 0.25 and sum(gap["far"]) / PAIRS > 0.3
    g = torch.Generator().manual_seed(seed)
    z, z_ref = pairs["far"][0]
    for name in NAMES:
        s = sampled_loss_gradient(z, z_ref, name, 4000, g)
        ev.record(f"far pair, 4,000 draws, {name} as loss: max |z| over the 8 logits", s["max |z|"], expect="< 5")
        # THRESHOLD: seeds 100-139, max |z| over 8 logits: k1 1.8 ± 0.6, k2 1.8 ± 0.5, k3 1.6 ± 0.6; largest 3.8
        assert s["max |z|"] < 5


@pytest.mark.claim("C-KLEST-1", "confirmed")
@pytest.mark.claim("C-FOLK-27", "refuted")
def test_reward_minus_each_estimator_as_a_loss_converges_to_a_different_policy(ev, seed):
    """Deterministic: gradient descent on −E_π[R] + β·(k as a loss), expectations exact, β = 0.3, from π = π_ref.
    With k2 it lands on the RLHF optimum π_ref·exp(R/β)/Z (the KL(π‖π_ref)-regularised one); with k3 on the
    KL(π_ref‖π)-regularised optimum, another policy; with k1 it follows the unpenalised run to round-off and drifts
    as far from the reference as no penalty does. C-FOLK-27 would stand if the k3 arm reached the RLHF optimum."""
    r = where_each_penalty_leads(seed)
    ev.record("TV distance between the KL(π‖π_ref) and KL(π_ref‖π) optima", r["TV between the two optima"])
    for arm in ARMS:
        ev.record(f"{arm}: TV to the KL(π‖π_ref) optimum, to the KL(π_ref‖π) optimum",
                  [round(r[arm]["TV to KL(pi||ref) optimum"], 6), round(r[arm]["TV to KL(ref||pi) optimum"], 6)])
        ev.record(f"{arm}: KL(π‖π_ref), E[R] after 400 steps", [round(r[arm]["KL(pi||ref)"], 4), round(r[arm]["E[R]"], 4)])
    ev.record("KL(π‖π_ref) of the RLHF optimum", r["KL(pi||ref) of the RLHF optimum"])
    ev.record("k1 arm minus no-penalty arm: largest |Δπ|", r["k1 minus no penalty, max |dp|"], expect="round-off")
    sep = r["TV between the two optima"]
    k2_off, k3_off = r["k2"]["TV to KL(pi||ref) optimum"] / sep, r["k3"]["TV to KL(ref||pi) optimum"] / sep
    drift = r["k1"]["KL(pi||ref)"] / r["KL(pi||ref) of the RLHF optimum"]
    ev.record("k2 arm: TV to its optimum / TV between the optima", k2_off, expect="≈ 0")
    ev.record("k3 arm: TV to its optimum / TV between the optima", k3_off, expect="≈ 0")
    ev.record("k1 arm: KL(π‖π_ref) / KL(π‖π_ref) of the RLHF optimum", drift)
    # seeds 100-139: TV between the optima 0.088 ± 0.056 (min 0.020; >= 0.01 by the redraw above); k2 arm's share of
    # it left after 400 steps 3e-4 ± 8e-4 (max 4e-3; 6e-3 over seeds 140-199), k3 arm's 2e-5 ± 7e-5 (max 3e-4);
    # k1 arm's KL over the optimum's 8.0 ± 5.9 (min 2.2; 2.07 over seeds 140-199)
    assert sep >= 0.01
    assert k2_off < 0.05 and r["k2"]["TV to KL(ref||pi) optimum"] > 0.5 * sep
    assert k3_off < 0.05 and r["k3"]["TV to KL(pi||ref) optimum"] > 0.5 * sep
    assert r["k1 minus no penalty, max |dp|"] < 1e-9
    assert drift > 1.2
