# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% [markdown]
# # Post-LN or Pre-LN?
#
# Proofs for the pages `docs/normalisation/pre-ln-vs-post-ln.md` and
# `docs/training/learning-rate-warmup.md` (the warm-up experiment). Every function
# builds the shared module (`proofs/transformer/`) and flips one switch:
# `norm_position` ("post": LayerNorm(x + f(x)), the paper's; "pre": x + f(LayerNorm(x))
# plus a final LayerNorm). The warm-up experiment also swaps the learning-rate
# schedule of `proofs/train.py` for the same schedule without its ramp.
# Run it with `pytest proofs/normalisation/proof_pre_post_ln.py`.

# %%
from __future__ import annotations

import math

import pytest
import torch

from proofs.tasks import lookup_task, random_tokens
from proofs.train import accuracy, fixed_batches, noam_schedule, token_loss, train
from proofs.transformer import EncoderTagger, TransformerConfig

DEPTHS = [2, 4, 8, 16, 32]  # encoder layers swept at initialisation
FIT_FROM = 4  # the depth exponent is fitted over L >= 4 (at L = 2 Post-LN's gradient is still growing)
V = 16  # vocabulary: token 0 is padding, 1..15 are real tokens


def tiny(n_layers: int, **switches) -> TransformerConfig:
    return TransformerConfig(vocab_size=V, d_model=32, n_heads=4, d_ff=64, n_layers=n_layers,
                             dropout_emb=0.0, dropout_residual=0.0).replace(**switches)


# %% [markdown]
# ## 1. Gradients at initialisation (Xiong et al. 2020, Theorem 1)
#
# The theorem bounds the gradient of the last layer's second FFN matrix W²: of
# order d·√(ln d) for Post-LN whatever the depth L, of order d·√(ln d / L) for
# Pre-LN. We measure that gradient, and every layer's, for one batch of random
# targets, averaged over three initialisations per seed.

# %%
# --8<-- [start:gradients]
def ffn_gradients(seed: int, n_layers: int, inits: int = 3, **switches) -> list[float]:
    """||dL/dW2|| of every layer's FFN (index 0 = bottom), mean over `inits` random models and batches."""
    total = torch.zeros(n_layers)
    for i in range(inits):
        torch.manual_seed(100 * seed + i)
        model = EncoderTagger(tiny(n_layers, **switches))
        g = torch.Generator().manual_seed(100 * seed + i)
        x, y = random_tokens(g, 16, 8, V), random_tokens(g, 16, 8, V)
        token_loss(model(x), y).backward()
        total += torch.tensor([layer.ffn.lin2.weight.grad.norm().item() for layer in model.encoder.layers])
    return (total / inits).tolist()


def depth_exponent(last_layer_grads: list[float]) -> float:
    """Least-squares slope of log(gradient) against log(L) for L >= FIT_FROM: 0 = flat, -0.5 = ∝ 1/√L."""
    pairs = [(math.log(d), math.log(g)) for d, g in zip(DEPTHS, last_layer_grads) if d >= FIT_FROM]
    x, y = torch.tensor(pairs).T
    xc = x - x.mean()
    return ((xc * (y - y.mean())).sum() / (xc * xc).sum()).item()
# --8<-- [end:gradients]


# %% [markdown]
# ## 2. Training at a high learning rate, with and without warm-up
#
# Four layers learn a per-token lookup table (lookup_table[token], see proofs/tasks.py) with Adam. The
# schedule is the paper's (§5.3: linear warm-up, then 1/√step decay, peak at
# step = warmup), scaled so that its peak is `peak_lr`. "Without warm-up" is the
# same schedule with the ramp replaced by its peak: the two arms differ only in
# the first `warmup` steps.

# %%
# --8<-- [start:warmup]
def schedule(warmup: int, ramp: bool, d_model: int = 32):
    """Noam schedule divided by its peak (so lr=peak_lr sets the peak); ramp=False holds the peak from step 0."""
    noam, peak = noam_schedule(d_model, warmup), d_model**-0.5 * warmup**-0.5
    return lambda step: noam(step if ramp else max(step, warmup - 1)) / peak


def warmup_run(seed: int, ramp: bool, peak_lr: float = 2e-2, warmup: int = 20, steps: int = 80,
               n_layers: int = 4, **switches) -> dict:
    torch.manual_seed(seed)
    model = EncoderTagger(tiny(n_layers, **switches))
    batches = fixed_batches(lookup_task, 1000 + seed, batch=16, length=8, vocab=V)
    log = train(model, batches, steps, lr=peak_lr, schedule=schedule(warmup, ramp))
    x, y = lookup_task(torch.Generator().manual_seed(10_000 + seed), 256, 8, V)
    return {"accuracy": accuracy(model, x, y), "final_loss": log.final(), "loss": log.loss, "diverged": log.diverged}
# --8<-- [end:warmup]


# %%
if __name__ == "__main__":  # notebook / script: flip a switch above and rerun
    for pos in ("post", "pre"):
        print(pos, [round(ffn_gradients(0, d, norm_position=pos)[-1], 3) for d in DEPTHS])
        for ramp in (False, True):
            print(pos, "warm-up" if ramp else "no warm-up", warmup_run(0, ramp, norm_position=pos)["accuracy"])


# %% [markdown]
# ## Tests

# %%
def _plot_gradients(ev, last, profile):
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullLocator

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.4))
    for pos, style in (("post", "o-"), ("pre", "s--")):
        axes[0].loglog(DEPTHS, last[pos], style, label=f"{pos.capitalize()}-LN")
        axes[1].plot(range(1, len(profile[pos]) + 1), profile[pos], style, label=f"{pos.capitalize()}-LN")
    ref = [last["pre"][0] * math.sqrt(DEPTHS[0] / d) for d in DEPTHS]
    axes[0].loglog(DEPTHS, ref, ":", color="grey", label="∝ 1/√L")
    axes[0].set(title="last layer's ||∂L/∂W²|| against depth L", xlabel="layers L")
    axes[0].set_xticks(DEPTHS, [str(d) for d in DEPTHS])
    axes[0].xaxis.set_minor_locator(NullLocator())
    axes[1].set(title="||∂L/∂W²|| per layer, L = 12", xlabel="layer (1 = bottom)", ylim=(0, None))
    axes[0].legend(fontsize=8)
    axes[1].legend(fontsize=8)
    fig.tight_layout()
    ev.figure(fig, "gradients", "FFN gradient norms at initialisation (mean of 3 seeds × 3 models). Left: the last "
                                "layer's, against depth. Right: every layer's, in a 12-layer stack.")


# --8<-- [start:test_gradients]
@pytest.mark.claim("C-FOLK-12", "nuanced")
def test_gradient_scale_at_init_follows_xiong_theorem(ev, seed):
    """At initialisation the last layer's FFN gradient is flat in depth for Post-LN and shrinks like 1/√L for Pre-LN."""
    seeds = [seed, seed + 1, seed + 2]
    last = {pos: [[ffn_gradients(s, d, norm_position=pos)[-1] for d in DEPTHS] for s in seeds] for pos in ("post", "pre")}
    slopes = {pos: [depth_exponent(run) for run in last[pos]] for pos in last}
    mean_last = {pos: torch.tensor(last[pos]).mean(0).tolist() for pos in last}
    profile = {pos: torch.tensor([ffn_gradients(s, 12, inits=1, norm_position=pos) for s in seeds]).mean(0).tolist()
               for pos in ("post", "pre")}
    _plot_gradients(ev, mean_last, profile)
    for pos in ("post", "pre"):
        ev.record(f"{pos.capitalize()}-LN: exponent of L in the last layer's gradient (3 seeds)", slopes[pos],
                  expect="0 (independent of depth)" if pos == "post" else "−0.5 (∝ 1/√L)")
        ev.record(f"{pos.capitalize()}-LN: last layer's gradient at L = 4 and L = 32 (mean of 3 seeds)",
                  [mean_last[pos][1], mean_last[pos][-1]], expect="equal" if pos == "post" else "ratio √8 ≈ 2.8")
    ev.record("Post-LN / Pre-LN gradient of the top layer, L = 12", profile["post"][-1] / profile["pre"][-1],
              expect="> 1: Post-LN's top layers get the larger gradients")
    # Pre-LN shrinks with depth (the theorem's exponent is −0.5; single seeds ranged about −0.25 to −0.6),
    # Post-LN stays flat; seed by seed, Pre-LN's exponent sits well below Post-LN's.
    assert max(slopes["pre"]) < -0.15
    assert max(abs(s) for s in slopes["post"]) < 0.35  # flat in depth (for L >= 4); seeds reached about 0.27
    assert all(pre < post - 0.3 for pre, post in zip(slopes["pre"], slopes["post"]))
    assert profile["post"][-1] > 2 * profile["pre"][-1]
# --8<-- [end:test_gradients]


def _plot_losses(ev, runs):
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 3.4))
    for (pos, ramp), style in zip(runs, ("-", "--", "-", "--")):
        color = "C0" if pos == "post" else "C1"
        label = f"{pos.capitalize()}-LN, {'warm-up' if ramp else 'no warm-up'}"
        ax.plot(runs[pos, ramp][0]["loss"], style, color=color, label=label, lw=1.2)
    ax.set(title="training loss (first of the 3 seeds)", xlabel="step", ylabel="cross-entropy", yscale="log")
    ax.legend(fontsize=8)
    fig.tight_layout()
    ev.figure(fig, "losses", "Training loss of the four arms (4 layers, peak lr 2e-2, 20 warm-up steps).")


# --8<-- [start:test_warmup]
@pytest.mark.claim("C-FOLK-12", "nuanced")
@pytest.mark.claim("C-LR-2", "nuanced")
def test_post_ln_needs_warmup_at_high_lr(ev, seed):
    """At a high peak lr Post-LN stalls without warm-up and trains with it; Pre-LN trains either way; at a low lr
    Post-LN needs no warm-up."""
    seeds = [seed, seed + 1, seed + 2]
    runs = {(pos, ramp): [warmup_run(s, ramp, norm_position=pos) for s in seeds]
            for pos in ("post", "pre") for ramp in (False, True)}
    low = [warmup_run(s, False, peak_lr=5e-3, norm_position="post") for s in seeds]
    _plot_losses(ev, runs)
    acc = {k: [r["accuracy"] for r in v] for k, v in runs.items()}
    for (pos, ramp), a in acc.items():
        label = f"{pos.capitalize()}-LN, {'with' if ramp else 'without'} warm-up, peak lr 2e-2"
        ev.record(f"accuracy, {label} (3 seeds)", a,
                  expect="stalls near chance (1/15)" if (pos, ramp) == ("post", False) else "learns")
        ev.record(f"final loss, {label} (3 seeds)", [r["final_loss"] for r in runs[pos, ramp]], key=False)
    ev.record("accuracy, Post-LN without warm-up, peak lr 5e-3 (3 seeds)", [r["accuracy"] for r in low],
              expect="learns: at a low lr no warm-up is needed")
    others = min(min(acc["post", True]), min(acc["pre", False]), min(acc["pre", True]))
    assert others > 0.9
    # Post-LN without warm-up: usually at chance, on some seeds partly trained (about 0.3 at most in windows 0-29);
    # asserted as a gap to every other arm rather than a fixed ceiling
    assert max(acc["post", False]) < others - 0.5
    assert min(r["accuracy"] for r in low) > 0.9
# --8<-- [end:test_warmup]
