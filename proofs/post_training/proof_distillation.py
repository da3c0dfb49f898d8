# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% [markdown]
# # Distillation: soft targets, temperature, and SFT on a teacher's samples
#
# Proofs for `docs/post-training/distillation.md`. The loss is the shared objectives module's
# (`proofs/post_training/objectives.py`: `distillation_loss`, Hinton et al. 2015, §2), the student the shared
# `DecoderLM`, the task the shared `markov_task` (`proofs/tasks.py`). Sections 1-3 are exact (float64 autograd and
# enumeration over a categorical). Section 4 trains seven tiny students (d_model 16, one layer) on one small transfer
# set, one per kind of target, each run cached per seed; its thresholds come from the spread over seeds 100-139.
# Run: `pytest proofs/post_training/proof_distillation.py`.

# %%
from __future__ import annotations

import functools

import pytest
import torch
import torch.nn.functional as F

from proofs.optim import FlatAdam
from proofs.post_training.objectives import distillation_loss
from proofs.tasks import markov_table, markov_task
from proofs.transformer import DecoderLM, TransformerConfig
from proofs.transformer.config import ConfigError

# %% [markdown]
# ## 1. The soft cross-entropy's gradient, exactly
#
# With teacher logits $v$, student logits $z$, $p = \mathrm{softmax}(v/T)$ and $q = \mathrm{softmax}(z/T)$, the soft
# cross-entropy $C = -\sum_i p_i \log q_i$ has $\partial C/\partial z_i = (q_i - p_i)/T$ (Hinton et al. 2015, §2.1,
# eq. 2). `distillation_loss` returns $T^2 C$, whose gradient is $T(q - p)$. When $T$ is large against the logits,
# $e^{x/T} \approx 1 + x/T$ and, with both logit vectors zero-meaned, $(q_i - p_i)/T \approx (z_i - v_i)/(N T^2)$ for
# $N$ classes (eqs. 3-4): the unscaled gradient shrinks as $1/T^2$ and the scaled one tends to
# $(z - v)/N$, the gradient of logit matching. Softmax ignores a constant added to every logit, so the exact
# gradient cannot see the means: the limit is $((z - \bar z) - (v - \bar v))/N$, and eq. 4 written with raw logits
# holds only under the paper's zero-mean condition. Both are checked, on seeded random logits in float64.

# %%
# --8<-- [start:gradient]
def soft_gradients(seed: int, temperatures=(1.0, 2.0, 4.0, 8.0, 32.0, 128.0), n: int = 6, V: int = 10) -> dict:
    """Autograd of distillation_loss against (q − p)/T and against the logit-matching limit, per temperature.
    Student and teacher logits (n, V) ~ N(0, 2²); the student's get an offset of 3 (its mean is not 0)."""
    g = torch.Generator().manual_seed(seed)
    v = 2 * torch.randn(n, V, generator=g, dtype=torch.float64)
    z0 = 2 * torch.randn(n, V, generator=g, dtype=torch.float64) + 3.0
    centred = lambda x: x - x.mean(-1, keepdim=True)
    limit = (centred(z0) - centred(v)) / V                # Hinton eq. 4 times T², logits zero-meaned first
    raw = (z0 - v) / V                                    # eq. 4 with the raw (not zero-meaned) logits
    out = {}
    for T in temperatures:
        z = z0.clone().requires_grad_(True)
        distillation_loss(z, v, T).backward()
        grad = z.grad * n                                 # the loss is a mean over the n rows: per-row gradient
        q, p = (z0 / T).softmax(-1), (v / T).softmax(-1)
        out[T] = {"|autograd - T(q - p)|": (grad - T * (q - p)).abs().max().item(),
                  "|unscaled autograd - (q - p)/T|": (grad / T**2 - (q - p) / T).abs().max().item(),
                  "|grad| (with T²)": grad.norm().item(),
                  "|grad| (without T²)": (grad / T**2).norm().item(),
                  "relative gap to the zero-meaned limit": ((grad - limit).norm() / limit.norm()).item(),
                  "relative gap to eq. 4 with raw logits": ((grad - raw).norm() / raw.norm()).item()}
    return out
# --8<-- [end:gradient]


# %% [markdown]
# ## 2. Why $T^2$: the soft term's share of a mixed loss, and what Adam does with it
#
# Hinton et al. (§2) train on a weighted sum of the soft cross-entropy (at $T$) and the hard-label cross-entropy (at
# $T = 1$) and multiply the soft term by $T^2$ because its gradients scale as $1/T^2$: without the factor, raising
# $T$ silently turns the mix into hard-label training. We measure the soft term's share of the gradient norm of
# $0.5\,\text{hard} + 0.5\,\text{soft}$ at each $T$, with and without the factor. The second half is the caveat:
# for a soft loss used alone, a constant factor on the loss does not change Adam's steps (its update
# $m/(\sqrt{v} + \epsilon)$ divides the scale out, up to $\epsilon$), so there $T^2$ changes nothing; it matters for
# SGD and for mixes. Checked by running Adam on a categorical student with and without the factor.

# %%
# --8<-- [start:mix]
def soft_share(seed: int, temperatures=(1.0, 2.0, 4.0, 8.0), n: int = 64, V: int = 10) -> dict:
    """Share of the soft term in |∇(0.5·CE(label) + 0.5·soft)| at the student's logits, with and without T²."""
    g = torch.Generator().manual_seed(seed)
    v = 3 * torch.randn(n, V, generator=g, dtype=torch.float64)
    z = 3 * torch.randn(n, V, generator=g, dtype=torch.float64)
    label = v.argmax(-1)                                  # the hard label: the teacher's top class
    hard = torch.autograd.functional.jacobian(lambda x: F.cross_entropy(x, label), z)
    out = {}
    for T in temperatures:
        soft = torch.autograd.functional.jacobian(lambda x: distillation_loss(x, v, T), z)  # with T²
        share = lambda s: (s.norm() / (s.norm() + hard.norm())).item()
        out[T] = {"with T²": share(soft), "without T²": share(soft / T**2)}
    return out


def adam_ignores_the_factor(seed: int, T: float = 4.0, steps: int = 200, V: int = 10) -> dict:
    """Adam (lr 0.05) on a categorical student's logits, soft loss alone, with T² and without: largest gap between
    the two students' logits after `steps` steps, next to how far the logits moved."""
    g = torch.Generator().manual_seed(seed)
    v = 3 * torch.randn(8, V, generator=g, dtype=torch.float64)
    z0 = torch.randn(8, V, generator=g, dtype=torch.float64)
    runs = {}
    for name, factor in (("with T²", 1.0), ("without T²", 1.0 / T**2)):
        z = z0.clone().requires_grad_(True)
        opt = torch.optim.Adam([z], lr=0.05, eps=1e-12)
        for _ in range(steps):
            opt.zero_grad()
            (factor * distillation_loss(z, v, T)).backward()
            opt.step()
        runs[name] = z.detach()
    return {"largest logit gap between the two runs": (runs["with T²"] - runs["without T²"]).abs().max().item(),
            "largest logit change from the start": (runs["with T²"] - z0).abs().max().item()}
# --8<-- [end:mix]


# %% [markdown]
# ## 3. SFT on teacher samples is the Monte Carlo version of the $T = 1$ soft target
#
# Train on a token $y$ drawn from the teacher, $y \sim p$, with the ordinary cross-entropy: the logit gradient is
# $q - e_y$. Its expectation over $y$ is $q - p$, the gradient of the soft cross-entropy at $T = 1$, so sampled
# labels estimate the $T = 1$ objective without bias (not the $T > 1$ one), and their noise around it is
# $E\lVert e_y - p\rVert^2 = 1 - \sum_i p_i^2$, zero only for a one-hot teacher. Soft targets pay one pass for the
# exact expectation; sampled labels need many draws to approach it. Exact, by enumerating $y$.

# %%
# --8<-- [start:samples]
def sampled_label_gradient(seed: int, V: int = 10) -> dict:
    """Enumerate y over the teacher's p: mean and variance of the sampled-label gradient q − e_y, against the
    gradients of distillation_loss at T = 1 and T = 2."""
    g = torch.Generator().manual_seed(seed)
    v = 2 * torch.randn(V, generator=g, dtype=torch.float64)
    z0 = torch.randn(V, generator=g, dtype=torch.float64)
    p = v.softmax(-1)
    grads = []
    for y in range(V):                                    # the cross-entropy gradient of each possible sampled label
        z = z0.clone().requires_grad_(True)
        grads.append(torch.autograd.grad(F.cross_entropy(z[None], torch.tensor([y])), z)[0])
    grads = torch.stack(grads)                            # (V, V): row y is q − e_y
    mean = (p[:, None] * grads).sum(0)
    variance = (p * ((grads - mean) ** 2).sum(-1)).sum()
    soft = {}
    for T in (1.0, 2.0):
        z = z0.clone().requires_grad_(True)
        soft[T] = torch.autograd.grad(distillation_loss(z, v, T), z)[0]
    return {"|E[sampled grad] - soft grad, T = 1|": (mean - soft[1.0]).abs().max().item(),
            "|E[sampled grad] - soft grad, T = 2|": (mean - soft[2.0]).abs().max().item(),
            "variance of the sampled gradient": variance.item(),
            "1 - sum p²": (1 - (p**2).sum()).item()}
# --8<-- [end:samples]


# %% [markdown]
# ## 4. Learning: seven students, one transfer set, seven kinds of target
#
# The data is `markov_task` over V = 16 tokens: walks on a fixed Markov chain (`markov_table`, rows
# softmax(3·N(0, 1))). The teacher is the ideal one, the chain itself: its logits at a position are
# $\log P(\cdot \mid x_t)$. Each seed draws one small transfer set of 16 walks of 16 tokens (256 positions, so each
# of the 16 states is visited about 16 times), and seven students with the same initial weights read the same inputs
# for the same 60 full-batch Adam steps. Only the targets differ:
#
# - **teacher's argmax**: the most likely next token (hard labels from the teacher);
# - **soft, T = 1, 2, 4**: `distillation_loss` against the teacher's logits;
# - **teacher samples, 1 per position**: one token drawn from the teacher at each position, once (a fixed SFT set
#   of the teacher's outputs, as in DeepSeek-R1's distilled models, §2.4, at token level);
# - **teacher samples, 8 per position**: eight such draws per position (the cross-entropy averaged over them);
# - **data's next tokens**: the walk's own next token (pre-training on the data).
#
# What is read: KL(true chain ‖ student) at every position of 64 held-out walks, averaged, which is also the
# student's excess loss over the chain's entropy. With the ideal teacher a sample from the teacher and the data's
# next token have the same distribution; the two arms differ only in which draw they got.

# %%
# --8<-- [start:learn]
V, WALKS, LENGTH, STEPS, LR = 16, 16, 16, 60, 2e-2
CHAIN_LOGITS = markov_table(V).log()  # (V, V): the ideal teacher's logits, row = current token
STUDENT = TransformerConfig(vocab_size=V, d_model=16, n_heads=2, d_ff=32, n_layers=1, norm_position="pre",
                            dropout_emb=0.0, dropout_residual=0.0, max_len=LENGTH)
ARMS = ("teacher's argmax", "soft, T = 1", "soft, T = 2", "soft, T = 4", "teacher samples, 1 per position",
        "teacher samples, 8 per position", "data's next tokens")


def transfer_set(seed: int) -> dict:
    """Inputs x (WALKS, LENGTH), the data's next tokens, 8 teacher samples per position, held-out inputs."""
    g = torch.Generator().manual_seed(seed)
    x, nxt = markov_task(g, WALKS, LENGTH, V)
    samples = torch.multinomial(CHAIN_LOGITS[x].exp().view(-1, V), 8, replacement=True, generator=g)
    held_out, _ = markov_task(torch.Generator().manual_seed(10**6 + seed), 64, LENGTH, V)
    return {"x": x, "next": nxt, "samples": samples.view(WALKS, LENGTH, 8), "held_out": held_out}


def arm_loss(arm: str, logits: torch.Tensor, data: dict) -> torch.Tensor:
    """The arm's loss on the student's logits (WALKS, LENGTH, V); the teacher's logits are the chain's log-probs."""
    teacher = CHAIN_LOGITS[data["x"]]  # (WALKS, LENGTH, V)
    if arm.startswith("soft"):
        return distillation_loss(logits, teacher, float(arm[-1]))
    if arm == "teacher samples, 8 per position":     # mean cross-entropy over the 8 draws of every position
        return F.cross_entropy(logits.unsqueeze(-2).expand(-1, -1, 8, -1).reshape(-1, V), data["samples"].reshape(-1))
    labels = {"teacher's argmax": teacher.argmax(-1), "teacher samples, 1 per position": data["samples"][..., 0],
              "data's next tokens": data["next"]}[arm]
    return F.cross_entropy(logits.reshape(-1, V), labels.reshape(-1))


@torch.no_grad()
def read_student(model: DecoderLM, x: torch.Tensor) -> tuple[float, float]:
    """Over every position of x: mean KL(P(· | x_t) ‖ student(· | x_≤t)), and the share of positions where the
    student's top token is the chain's most likely next token."""
    logp, logq = CHAIN_LOGITS[x].log_softmax(-1), model(x).log_softmax(-1)
    kl = (logp.exp() * (logp - logq)).sum(-1).mean().item()
    return kl, (logq.argmax(-1) == logp.argmax(-1)).float().mean().item()


@functools.lru_cache(maxsize=None)
def student_run(seed: int, arm: str) -> dict:
    """One student trained on one kind of target: KL to the chain on the held-out walks every 5 steps (the curve)
    and, at the end, its KL and top-1 agreement with the chain."""
    data = transfer_set(seed)
    torch.manual_seed(seed)
    model = DecoderLM(STUDENT)
    opt = FlatAdam(model.parameters(), lr=LR, betas=(0.9, 0.98), eps=1e-9)  # train.py's Adam
    curve = []
    for step in range(STEPS + 1):
        if step % 5 == 0:
            curve.append(read_student(model.eval(), data["held_out"])[0])
            model.train()
        if step < STEPS:
            loss = arm_loss(arm, model(data["x"]), data)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
    kl, top1 = read_student(model.eval(), data["held_out"])
    return {"curve": curve, "kl": kl, "best kl on the curve": min(curve), "top-1 agreement": top1,
            "last training loss": loss.item()}


def chain_entropy(seed: int) -> float:
    """Mean entropy of the chain's next-token distribution over the transfer set's positions: the lowest loss a
    student that learned the chain (and not the particular labels it was shown) can have on one-label targets."""
    logp = CHAIN_LOGITS[transfer_set(seed)["x"]].log_softmax(-1)
    return -(logp.exp() * logp).sum(-1).mean().item()
# --8<-- [end:learn]


# %% [markdown]
# ## The tests

# %%
@pytest.mark.claim("C-DISTIL-1", "confirmed")
def test_soft_gradient_is_q_minus_p_over_t_and_t_squared_keeps_its_size(ev, seed):
    """Exact, float64. Autograd of distillation_loss equals T(q − p) (so the soft cross-entropy alone gives
    (q − p)/T, Hinton eq. 2) at every T; without the T² factor the gradient's norm falls as 1/T², with it the norm
    settles; and T(q − p) tends to the zero-meaned logit difference /N (eq. 4), the gap shrinking as 1/T, while eq. 4
    with the raw logits (the student's mean is 3) stays wrong at every T. Would fail if the module's loss had
    another gradient (a missing or doubled T, a KL with the arguments swapped) or if the high-T limit were not
    logit matching."""
    r = soft_gradients(seed)
    for T, m in r.items():
        ev.record(f"T = {T:g}: max |autograd - T(q - p)|", m["|autograd - T(q - p)|"], expect="0 (1e-15)", key=T == 8)
        ev.record(f"T = {T:g}: |grad| with T², without T²", [m["|grad| (with T²)"], m["|grad| (without T²)"]],
                  key=T in (1, 8))
        ev.record(f"T = {T:g}: gap to the zero-meaned limit, to eq. 4 with raw logits",
                  [m["relative gap to the zero-meaned limit"], m["relative gap to eq. 4 with raw logits"]],
                  key=T in (8, 128))
    for m in r.values():
        assert m["|autograd - T(q - p)|"] < 1e-12 and m["|unscaled autograd - (q - p)/T|"] < 1e-12
    # limits of calculus on random logits (corrections O(|z|/T)); seeds 100-139: gap ratio T = 32 / T = 128 3.93-4.05,
    # smallest raw-logit gap 0.67
    n32, n128 = (r[T]["|grad| (without T²)"] for T in (32, 128))
    assert n32 / n128 == pytest.approx(16, rel=0.02)                          # 1/T² once T is large
    assert r[128]["|grad| (with T²)"] / r[32]["|grad| (with T²)"] == pytest.approx(1, abs=0.02)
    gaps = [r[T]["relative gap to the zero-meaned limit"] for T in (8, 32, 128)]
    assert gaps[0] > gaps[1] > gaps[2] and gaps[2] < 0.02 and gaps[1] / gaps[2] == pytest.approx(4, rel=0.1)
    assert min(m["relative gap to eq. 4 with raw logits"] for m in r.values()) > 0.5


@pytest.mark.claim("C-DISTIL-1", "confirmed")
def test_t_squared_keeps_the_mix_and_adam_makes_it_moot_alone(ev, seed):
    """Exact. In 0.5·hard + 0.5·soft the soft term's share of the gradient stays put as T goes 1 -> 8 with the T²
    factor and collapses without it (Hinton §2's reason for the factor). Used alone under Adam the factor changes
    nothing: two Adam runs with and without it end with the same logits (to 1e-6 of a change of order 1). Would fail
    if the share fell with T² too, or if Adam's path depended on the loss's scale."""
    s = soft_share(seed)
    for T, m in s.items():
        ev.record(f"T = {T:g}: soft share of the mixed gradient, with T², without", [m["with T²"], m["without T²"]])
    a = adam_ignores_the_factor(seed)
    for k, val in a.items():
        ev.record(f"Adam, soft loss alone, T = 4: {k}", val)
    # seeds 100-139: share at T = 1 0.43-0.46; at T = 8 with T² 0.51-0.54, without T² 0.016-0.018
    assert s[8.0]["without T²"] < 0.5 * s[1.0]["without T²"]    # without T²: the soft term fades as T grows
    assert s[8.0]["with T²"] > 0.5 * s[1.0]["with T²"]          # with T²: it keeps its weight
    assert a["largest logit gap between the two runs"] < 1e-6 < 0.5 < a["largest logit change from the start"]


@pytest.mark.claim("C-DISTIL-1", "confirmed")
def test_sampled_labels_estimate_the_t1_soft_gradient_with_noise(ev, seed):
    """Exact, by enumeration: the expected cross-entropy gradient of a label drawn from the teacher equals the soft
    gradient at T = 1 (an identity), differs from the soft gradient at T = 2, and has variance 1 − Σp² around it.
    Would fail if SFT on teacher samples estimated something other than the T = 1 soft target, or had no noise."""
    r = sampled_label_gradient(seed)
    for k, val in r.items():
        ev.record(k, val)
    assert r["|E[sampled grad] - soft grad, T = 1|"] < 1e-12
    assert r["|E[sampled grad] - soft grad, T = 2|"] > 1e-2
    assert r["variance of the sampled gradient"] == pytest.approx(r["1 - sum p²"], abs=1e-12)
    assert r["1 - sum p²"] > 1e-3  # the teacher is not one-hot, so a sampled label is noisy (0.075-0.85, seeds 100-139)


def test_bad_distillation_settings_raise_config_error(ev):
    """distillation_loss refuses T <= 0 and logits over two different vocabularies, naming the fix."""
    z = torch.zeros(2, 5)
    for T in (0.0, -1.0):
        with pytest.raises(ConfigError, match="temperature") as err:
            distillation_loss(z, z, T)
        ev.record(f"T = {T:g}", str(err.value), key=False)
    with pytest.raises(ConfigError, match="vocabulary") as err:
        distillation_loss(z, torch.zeros(2, 6))
    ev.record("student over 5 tokens, teacher over 6", str(err.value), key=False)


@pytest.mark.claim("C-DISTIL-1", "confirmed")
def test_soft_targets_carry_more_than_argmax_or_one_sample(ev, seed):
    """Seven students, equal steps, one transfer set (section 4). Every soft-target student ends far closer to the
    true chain than any student given one label per position (the teacher's argmax, one teacher sample, or the
    data's next token), even when those are stopped at their best point of the curve (an early stop chosen on the
    held-out walks, which favours them); eight teacher samples per position land in between. The argmax student picks
    the chain's top token almost every time (top-1 > 0.9) and gets the distribution wrong. Would fail (and soft
    targets would carry no more than labels) if a one-label arm came within a factor 1.5 of the soft arms' KL, if
    eight samples did no better than one, or if eight samples matched the soft targets."""
    runs = {arm: student_run(seed, arm) for arm in ARMS}
    for arm, r in runs.items():
        ev.record(f"{arm}: KL to the chain after {STEPS} steps", r["kl"])
        ev.record(f"{arm}: best KL along the curve", r["best kl on the curve"], key=False)
        ev.record(f"{arm}: top-1 agrees with the chain", r["top-1 agreement"], key=False)
        if not arm.startswith("soft"):
            ev.record(f"{arm}: cross-entropy on its own labels at the last step", r["last training loss"], key=False)
    ev.record("the chain's entropy at the transfer set's positions", chain_entropy(seed), key=False)
    soft = [runs[a]["kl"] for a in ARMS if a.startswith("soft")]
    one_label = ("teacher's argmax", "teacher samples, 1 per position", "data's next tokens")
    best_one_label = min(runs[a]["best kl on the curve"] for a in one_label)
    ev.record("best one-label KL (early-stopped) / worst soft KL", best_one_label / max(soft), expect="> 1.5")
    ev.record("soft students: largest minus smallest KL (T = 1, 2, 4)", max(soft) - min(soft), key=False)
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    steps = list(range(0, STEPS + 1, 5))
    for arm, r in runs.items():
        ax.plot(steps, r["curve"], label=arm, ls="-" if arm.startswith("soft") else "--")
    ax.set(xlabel="Adam step (full batch of 256 positions)", ylabel="KL(true chain ‖ student), held out", yscale="log")
    ax.legend(fontsize=7, ncol=2)
    ev.figure(fig, "curves", caption="Held-out KL of each student during training, one seed. Soft targets keep "
              "falling; one label per position falls, then climbs as the student fits its 256 particular labels.")
    # Thresholds from seeds 100-139 (ratios read in log space, where their spread is symmetric):
    # best one-label KL / worst soft KL: log mean 1.73 ± 0.37, ratio min 2.9, max 12.8 -> > 1.5 is 3.6 sd below the mean
    assert best_one_label > 1.5 * max(soft)
    # argmax KL / worst soft KL: log mean 3.40 ± 0.41, ratio min 16, max 77 -> > 5 is 4.4 sd below the mean
    assert runs["teacher's argmax"]["kl"] > 5 * max(soft)
    top1_gap = runs["teacher's argmax"]["top-1 agreement"] - max(runs[a]["top-1 agreement"] for a in ARMS[1:4])
    ev.record("teacher's argmax: top-1 agreement minus the best soft student's", top1_gap, key=False)
    # argmax top-1: 0.993 ± 0.007, min 0.970 over seeds 100-139 (140-179: min 0.960) -> > 0.9 is 12 sd below the
    # mean: it gets the top token right and the distribution wrong. (Its lead over the best soft student, 0.048 ±
    # 0.018, min 0.019 over 80 seeds, is positive on every seed but only 2.6 sd from 0, so it is not asserted.)
    assert runs["teacher's argmax"]["top-1 agreement"] > 0.9
    s1, s8 = runs["teacher samples, 1 per position"]["kl"], runs["teacher samples, 8 per position"]["kl"]
    ev.record("teacher samples, 8 per position: KL / best soft KL", s8 / min(soft), key=False)
    # 8 samples / 1 sample: 0.115 ± 0.029, max 0.18 -> < 0.3 is 6.4 sd above the mean
    assert s8 < 0.3 * s1
    # 8 samples / best soft KL: log mean 1.16 ± 0.37, ratio min 1.53 -> > 1 is 3.1 sd below the mean (seeds 100-139);
    # tail check on seeds 140-179: ratio 3.38 ± 1.43, min 1.63, 0 failures. "> 1" is the weakest form of "eight
    # draws do not match the exact target" (it cannot be lowered and keep its meaning); the margin is the observed
    # minimum over 80 seeds, 1.5x above it
    assert s8 > min(soft)
