# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% [markdown]
# # Label smoothing: what target, what floor, what effect?
#
# Proofs for the page `docs/training/label-smoothing.md`. The shared trainer
# (`proofs/train.py: token_loss`) passes `label_smoothing=ε` to
# `F.cross_entropy`; these proofs check which smoothed target that is, what loss
# and logits it drives a model to, and what it changes on a small model, with
# ε = 0 against ε = 0.1 (the paper's value) as the one switch.
# Run it with `pytest proofs/training/proof_label_smoothing.py`.

# %%
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from proofs.tasks import lookup_task
from proofs.train import fixed_batches, token_loss, train
from proofs.transformer import EncoderTagger, TransformerConfig

V = 16  # vocabulary size K
EPS = 0.1  # ε_ls of the paper's base model


# %% [markdown]
# ## 1. Two ways to spread ε
#
# Szegedy et al. (2016, §7): q′(k) = (1 − ε)·δ(k, y) + ε/K, so the true class keeps
# 1 − ε + ε/K. "1 − ε on the true class, ε shared by the other K − 1" is a different
# target. We write both out and compare them with what PyTorch computes.

# %%
# --8<-- [start:targets]
def smoothed_target(y: torch.Tensor, eps: float, k: int, over_the_rest: bool = False) -> torch.Tensor:
    """(N,) labels -> (N, K) target distributions."""
    one_hot = F.one_hot(y, k).double()
    if over_the_rest:  # 1 - eps on the true class, eps / (K - 1) on each other class
        return (1 - eps) * one_hot + eps / (k - 1) * (1 - one_hot)
    return (1 - eps) * one_hot + eps / k  # Szegedy et al.: eps / K on every class, the true one included


def soft_cross_entropy(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return -(target * logits.log_softmax(-1)).sum(-1).mean()
# --8<-- [end:targets]


# %% [markdown]
# ## 2. The optimum of the smoothed loss
#
# Minimise the smoothed cross-entropy over a free logit vector (no model). The
# minimiser puts probability q′ on every class, so the loss cannot go below the
# entropy H(q′) and the logit gap between the true class and any other stops at
# log((1 − ε + ε/K)/(ε/K)). Without smoothing the optimum is at infinity: the gap
# grows for as long as you train.

# %%
# --8<-- [start:free_logits]
def descend_free_logits(eps: float, checkpoints: list[int], lr: float = 2.0) -> dict[int, tuple[float, float, float]]:
    """Gradient descent on one logit vector (label 0); at each checkpoint: (p_true, gap true − other, loss)."""
    z = torch.zeros(V, dtype=torch.float64, requires_grad=True)
    y = torch.zeros(1, dtype=torch.long)
    opt = torch.optim.SGD([z], lr=lr)
    out = {}
    for step in range(1, max(checkpoints) + 1):
        opt.zero_grad()
        F.cross_entropy(z[None], y, label_smoothing=eps).backward()
        opt.step()
        if step in checkpoints:
            with torch.no_grad():
                loss = F.cross_entropy(z[None], y, label_smoothing=eps).item()
                out[step] = (z.softmax(-1)[0].item(), (z[0] - z[1:].mean()).item(), loss)
    return out
# --8<-- [end:free_logits]


# %% [markdown]
# ## 3. A small model, with and without smoothing
#
# A per-token lookup (target = lookup_table[token], see proofs/tasks.py) learned by a one-layer encoder in two
# regimes: (A) fresh clean batches at every step, so there is nothing to over-fit;
# (B) 32 training sequences whose labels are replaced by a random token 30 % of
# the time, seen 50 times each, so the model memorises the noise. Held-out data is
# drawn the same way as the training data. Calibration: expected calibration error
# (ECE) over 10 equal-width confidence bins.

# %%
# --8<-- [start:model]
def noisy_lookup(g: torch.Generator, n: int, length: int = 8, noise: float = 0.3):
    """The lookup task with 30 % of labels replaced at random (see proofs/tasks.py)."""
    return lookup_task(g, n, length, V, noise)


@torch.no_grad()
def calibration(model, x, y, bins: int = 10) -> dict:
    model.eval()
    logits = model(x).reshape(-1, V)
    conf, pred = logits.softmax(-1).max(-1)
    right = (pred == y.reshape(-1)).double()
    ece, curve = 0.0, []
    for lo in range(bins):  # |accuracy − confidence| per bin, weighted by the bin's share of tokens
        inside = (conf > lo / bins) & (conf <= (lo + 1) / bins)
        if inside.any():
            c, a = conf[inside].double().mean().item(), right[inside].mean().item()
            ece += inside.double().mean().item() * abs(a - c)
            curve.append((c, a))
    return {"nll": F.cross_entropy(logits, y.reshape(-1)).item(), "accuracy": right.mean().item(),
            "confidence": conf.mean().item(), "ece": ece, "curve": curve}


def smoothing_run(seed: int, eps: float, noisy: bool, steps: int = 50) -> dict:
    torch.manual_seed(seed)
    model = EncoderTagger(TransformerConfig(vocab_size=V, d_model=32, n_heads=4, d_ff=64, n_layers=1,
                                            dropout_emb=0.0, dropout_residual=0.0))
    noise = 0.3 if noisy else 0.0
    if noisy:  # regime B: one small noisy training set, seen again and again
        xt, yt = noisy_lookup(torch.Generator().manual_seed(seed), 32, noise=noise)
        batches = lambda step: (xt, yt)  # noqa: E731
    else:  # regime A: a fresh clean batch at every step
        batches = fixed_batches(lambda g, b, t, v: noisy_lookup(g, b, t, noise=0.0), 1000 + seed, 16, 8, V)
    train(model, batches, steps, lr=1e-2, label_smoothing=eps)  # 50 Adam steps at 1e-2: seconds, not minutes
    xv, yv = noisy_lookup(torch.Generator().manual_seed(10_000 + seed), 512, noise=noise)
    return calibration(model, xv, yv)
# --8<-- [end:model]


# %%
if __name__ == "__main__":
    print("free logits, eps=0.1:", descend_free_logits(EPS, [10, 100, 1000]))
    for noisy in (False, True):
        for eps in (0.0, EPS):
            print("noisy" if noisy else "clean", eps, smoothing_run(0, eps, noisy))


# %% [markdown]
# ## Tests

# %%
# --8<-- [start:test_target]
@pytest.mark.claim("C-LS-1", "nuanced")
def test_pytorch_spreads_eps_over_all_classes(ev, seed):
    """F.cross_entropy(label_smoothing=ε), and so the shared trainer, targets (1 − ε)δ + ε/K (read off its gradient):
    the true class keeps 1 − ε + ε/K, not the 1 − ε of "spread over the rest"."""
    g = torch.Generator().manual_seed(seed)
    logits = (torch.randn(256, V, generator=g, dtype=torch.float64) * 3).requires_grad_()
    y = torch.randint(0, V, (256,), generator=g)
    # the gradient of mean cross-entropy w.r.t. the logits is (p − q)/N: read the target q that PyTorch used
    F.cross_entropy(logits, y, label_smoothing=EPS).backward()
    q_torch = logits.softmax(-1).detach() - len(y) * logits.grad
    logits.grad = None
    token_loss(logits[None], y[None], label_smoothing=EPS).backward()  # the shared trainer's loss
    q_trainer = logits.softmax(-1).detach() - len(y) * logits.grad
    all_k, rest = smoothed_target(y, EPS, V), smoothed_target(y, EPS, V, over_the_rest=True)
    ev.record("max |PyTorch's target − (1 − ε)δ + ε/K|", (q_torch - all_k).abs().max().item(), expect="0")
    ev.record("max |shared trainer's target − (1 − ε)δ + ε/K|", (q_trainer - all_k).abs().max().item(), expect="0")
    ev.record("max |PyTorch's target − 'ε over the rest'|", (q_torch - rest).abs().max().item(),
              expect="ε/K = 0.00625 on the true class")
    ev.record("true-class mass in PyTorch's target", q_torch[0, y[0]].item(), expect="1 − ε + ε/K = 0.90625")
    ev.record("true-class mass, 'over the rest'", rest[0, y[0]].item(), expect="1 − ε = 0.9")
    assert (q_torch - all_k).abs().max() < 1e-12 and (q_trainer - all_k).abs().max() < 1e-12
    assert (q_torch - rest).abs().max().item() == pytest.approx(EPS / V, rel=1e-9)
    # the loss itself: PyTorch's value is the cross-entropy against the ε/K target
    with torch.no_grad():
        gap = abs(F.cross_entropy(logits, y, label_smoothing=EPS).item() - soft_cross_entropy(logits, all_k).item())
    ev.record("|PyTorch's loss − cross-entropy against that target|", gap, expect="0")
    assert gap < 1e-12
# --8<-- [end:test_target]


def _plot_free(ev, curves, floor_gap):
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 3.4))
    for eps, pts in curves.items():
        ax.semilogx([s for s, _ in pts], [gap for _, gap in pts], "o-", label=f"ε = {eps}")
    ax.axhline(floor_gap, color="grey", ls=":", label="log((1 − ε + ε/K)/(ε/K)), ε = 0.1")
    ax.set(title="logit gap true − other, gradient descent on free logits (K = 16)", xlabel="steps", ylabel="gap")
    ax.legend(fontsize=8)
    fig.tight_layout()
    ev.figure(fig, "free_logits", "Without smoothing the gap keeps growing; with ε = 0.1 it stops at the closed form.")


# --8<-- [start:test_floor]
@pytest.mark.claim("C-LS-1", "nuanced")
def test_smoothing_sets_a_loss_floor_and_a_finite_logit_gap(ev, seed):
    """With ε > 0 the optimum is finite: p_true = 1 − ε + ε/K, gap = log((1 − ε + ε/K)/(ε/K)), loss = H(q′).
    With ε = 0 the gap grows without bound."""
    p_opt = 1 - EPS + EPS / V
    gap_opt = math.log(p_opt / (EPS / V))
    entropy = -(p_opt * math.log(p_opt) + (V - 1) * (EPS / V) * math.log(EPS / V))
    checkpoints = [10, 30, 100, 300, 1000]
    runs = {eps: descend_free_logits(eps, checkpoints) for eps in (0.0, EPS)}
    curves = {eps: [(s, r[s][1]) for s in checkpoints] for eps, r in runs.items()}
    p, gap, loss = runs[EPS][checkpoints[-1]]
    _plot_free(ev, curves, gap_opt)
    ev.record("optimal p_true, measured", p, expect=f"1 − ε + ε/K = {p_opt}")
    ev.record("optimal logit gap, measured", gap, expect=f"log((1 − ε + ε/K)/(ε/K)) = {gap_opt:.4f}")
    ev.record("lowest loss, measured", loss, expect=f"H(q′) = {entropy:.4f} > 0")
    ev.record("gap without smoothing after 100, 300, 1000 steps", [runs[0.0][s][1] for s in (100, 300, 1000)],
              expect="keeps growing (≈ log of the steps)")
    assert p == pytest.approx(p_opt, abs=1e-9) and gap == pytest.approx(gap_opt, abs=1e-6)
    assert loss == pytest.approx(entropy, abs=1e-9)
    g0 = [runs[0.0][s][1] for s in (100, 300, 1000)]
    assert g0[0] + 0.5 < g0[1] < g0[2] - 0.5 and g0[2] > gap_opt + 2
# --8<-- [end:test_floor]


def _plot_reliability(ev, res):
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6))
    for ax, (noisy, title) in zip(axes, ((False, "(A) clean, fresh data"), (True, "(B) 32 noisy sequences"))):
        ax.plot([0, 1], [0, 1], ":", color="grey", label="calibrated")
        for eps, style in ((0.0, "o-"), (EPS, "s--")):
            curve = res[noisy, eps][0]["curve"]
            ax.plot([c for c, _ in curve], [a for _, a in curve], style, label=f"ε = {eps}")
        ax.set(title=title, xlabel="confidence (bin mean)", ylabel="accuracy in the bin", xlim=(0, 1), ylim=(0, 1.02))
        ax.legend(fontsize=8)
    fig.tight_layout()
    ev.figure(fig, "reliability", "Reliability diagrams on held-out tokens (first seed): below the diagonal is "
                                  "over-confident, above it under-confident.")


# --8<-- [start:test_model]
@pytest.mark.claim("C-LS-1", "nuanced")
def test_smoothing_costs_nll_on_clean_data_and_cuts_overconfidence_on_noisy(ev, seed):
    """Clean, plentiful data: smoothing raises held-out NLL, caps confidence and makes the model under-confident.
    Small noisy data: the unsmoothed model
    is over-confident and smoothing lowers both its held-out NLL and its calibration error. Accuracy barely moves."""
    seeds = [seed, seed + 1, seed + 2]
    res = {(noisy, eps): [smoothing_run(s, eps, noisy) for s in seeds] for noisy in (False, True) for eps in (0.0, EPS)}

    def col(noisy, eps, k):
        return [r[k] for r in res[noisy, eps]]

    _plot_reliability(ev, res)

    for noisy, regime in ((False, "A clean"), (True, "B noisy")):
        for eps in (0.0, EPS):
            for k in ("nll", "confidence", "accuracy", "ece"):
                ev.record(f"{regime}, ε = {eps}: held-out {k} (3 seeds)", col(noisy, eps, k),
                          key=k in ("nll", "ece") or (k == "confidence" and not noisy))
    # A: nothing to over-fit; smoothing's cap costs likelihood, not accuracy
    assert all(a > b + 0.05 for a, b in zip(col(False, EPS, "nll"), col(False, 0.0, "nll")))
    assert max(col(False, EPS, "confidence")) < 1 - EPS + EPS / V + 0.01 < min(col(False, 0.0, "confidence"))
    assert min(col(False, 0.0, "accuracy") + col(False, EPS, "accuracy")) > 0.99
    assert all(a > b for a, b in zip(col(False, EPS, "ece"), col(False, 0.0, "ece")))  # under-confident: ECE rises
    # B: memorised noise makes the plain model over-confident; smoothing cuts NLL and ECE. Seeds 100-139 (x3):
    # confidence 0.81 ± 0.023 vs accuracy 0.50 ± 0.035; NLL 2.99 ± 0.17 -> 2.26 ± 0.12; ECE 0.307 ± 0.025 ->
    # 0.186 ± 0.024; accuracy 0.504 -> 0.509. Means over the three paired seeds, bounds several sd away.
    def paired(k):  # mean over the seeds of (ε = 0.1) − (ε = 0), paired by seed
        return sum(a - b for a, b in zip(col(True, EPS, k), col(True, 0.0, k))) / len(seeds)

    assert all(c > a + 0.15 for c, a in zip(col(True, 0.0, "confidence"), col(True, 0.0, "accuracy")))
    assert paired("nll") < -0.3 and paired("ece") < -0.04 and abs(paired("accuracy")) < 0.05
# --8<-- [end:test_model]
