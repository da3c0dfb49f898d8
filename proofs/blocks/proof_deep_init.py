# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% [markdown]
# # How do deep stacks stay stable at initialisation?
#
# Proofs for `docs/blocks/deep-init.md`. Two switches of the shared model:
#
# - `depth_init="gpt2"` (Radford et al. 2019, §2.3): each residual branch's output projection (attention
#   W_O, the FFN's W₂) is scaled by 1/√(2L) at initialisation, L layers, 2 branches each.
# - `depth_init="deepnorm"` (Wang et al. 2022): Post-LN becomes LN(α·x + f(x)), and W_V, W_O and the FFN
#   matrices start β times smaller, with α, β set by the depth.
#
# Run: `pytest proofs/blocks/proof_deep_init.py`.

# %%
from __future__ import annotations

import math

import torch

from proofs.normalisation.proof_pre_post_ln import V as LOOKUP_V
from proofs.normalisation.proof_pre_post_ln import tiny, warmup_run
from proofs.tasks import lookup_task
from proofs.train import fixed_batches, train
from proofs.transformer import DecoderLM, EncoderTagger, TransformerConfig
from proofs.transformer.models import deepnorm_constants

DEPTHS = [2, 4, 8, 16, 32]


# %% [markdown]
# ## 1. GPT-2's 1/√(2L): the residual stream's variance at initialisation
#
# In a Pre-LN stack x_{l+1} = x_l + f_l(LN(x_l)). Every branch reads a normalised input, so at
# initialisation each adds roughly the same variance v, independent of l: Var(x_L) ≈ Var(x_0) + 2L·v.
# Scaling the last matrix of every branch by 1/√(2L) scales v by 1/(2L), so the total added variance stays
# about v whatever the depth. We measure Var(x_L)/Var(x_0) of a Pre-LN DecoderLM at init (the stream
# before the final norm), both arms, averaged over three initialisations.

# %%
# --8<-- [start:variance]
def init_cfg(n_layers: int, **switches) -> TransformerConfig:
    return TransformerConfig(vocab_size=16, d_model=64, n_heads=4, d_ff=256, n_layers=n_layers, norm_position="pre",
                             bias=False, dropout_emb=0.0, dropout_residual=0.0, **switches)


@torch.no_grad()
def stream_variance(seed: int, n_layers: int, depth_init: str, inits: int = 3) -> list[float]:
    """Var(x_l) / Var(x_0) after every layer l = 0..L of a freshly initialised Pre-LN DecoderLM, mean of `inits`."""
    total = torch.zeros(n_layers + 1)
    for i in range(inits):
        torch.manual_seed(1000 * seed + i)
        model = DecoderLM(init_cfg(n_layers, depth_init=depth_init)).eval()
        ids = torch.randint(1, 16, (8, 32), generator=torch.Generator().manual_seed(1000 * seed + i))
        x = model.embed(ids)
        v = [x.var()]
        for layer in model.decoder.layers:
            x = layer(x)
            v.append(x.var())
        v = torch.stack(v)
        total += v / v[0]
    return (total / inits).tolist()


def growth_exponent(depths: list[int], added: list[float]) -> float:
    """Least-squares slope of log(added variance) against log(L): 1 = linear growth, 0 = flat."""
    x, y = torch.tensor(depths).log(), torch.tensor(added).log()
    xc = x - x.mean()
    return ((xc * (y - y.mean())).sum() / (xc * xc).sum()).item()
# --8<-- [end:variance]


# %% [markdown]
# ## 2. DeepNorm: a deep Post-LN stack at a learning rate where it fails
#
# The experiment of the Pre-LN page (`proof_pre_post_ln.py`: an EncoderTagger learns a per-token lookup
# table with Adam for 80 steps, the peak learning rate from the first step, no warm-up), with the depth pushed from 4 to 8
# layers and lr 1e-2. Depth and lr are pushed because that is where plain Post-LN stalls in this budget;
# at lr 1e-3 the same 8-layer Post-LN stack trains. One switch differs between the arms:
# `depth_init="deepnorm"`, which for an 8-layer encoder-only stack sets α = (2N)^¼ = 2 and
# β = (8N)^-¼ ≈ 0.35 (DeepNet's table). We also measure how far one Adam step moves the stack's output:
# DeepNet's argument is that Post-LN's early updates are too large.

# %%
# --8<-- [start:deepnorm]
DEEP, HIGH_LR, LOW_LR = 8, 1e-2, 1e-3


def deep_run(seed: int, lr: float, **switches) -> dict:
    """The Pre-LN page's lookup experiment without warm-up (peak lr from step 0, then its 1/√step decay), at DEEP."""
    return warmup_run(seed, False, peak_lr=lr, n_layers=DEEP, **switches)


@torch.no_grad()
def _encode(model, x):
    return model.encoder(model.embed(x))


def first_step_change(seed: int, lr: float = HIGH_LR, inits: int = 4, **switches) -> float:
    """||h after one Adam step − h at init|| / ||h at init||, h = the encoder output on held-out tokens; mean over
    `inits` initialisations and batches."""
    total = 0.0
    for i in range(inits):
        torch.manual_seed(100 * seed + i)
        model = EncoderTagger(tiny(DEEP, **switches))
        x, _ = lookup_task(torch.Generator().manual_seed(10_000 + 100 * seed + i), 64, 8, LOOKUP_V)
        before = _encode(model.eval(), x)
        batches = fixed_batches(lookup_task, 1000 + 100 * seed + i, batch=16, length=8, vocab=LOOKUP_V)
        train(model, batches, 1, lr=lr)
        after = _encode(model.eval(), x)
        total += ((after - before).norm() / before.norm()).item()
    return total / inits
# --8<-- [end:deepnorm]


# %%
if __name__ == "__main__":
    for init in ("none", "gpt2"):
        print(init, [round(stream_variance(0, L, init)[-1], 2) for L in DEPTHS])
    print({k: deep_run(0, HIGH_LR, **sw)["accuracy"] for k, sw in (("post", {}), ("deepnorm", {"depth_init": "deepnorm"}))})


# %% [markdown]
# ## Tests

# %%
import pytest  # noqa: E402


def _plot_variance(ev, profiles: dict):
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.2), constrained_layout=True)
    for (label, color), finals in profiles["final"].items():
        axes[0].plot(DEPTHS, finals, "o-", color=color, label=label)
    axes[0].set(xscale="log", yscale="log", xlabel="layers L", ylabel="Var(x_L) / Var(x_0) at init", xticks=DEPTHS,
                xticklabels=DEPTHS)
    for (label, color), prof in profiles["profile"].items():
        axes[1].plot(range(len(prof)), prof, color=color, label=label)
    axes[1].set(xlabel="layer l (32-layer stack)", ylabel="Var(x_l) / Var(x_0)")
    axes[0].legend(frameon=False)
    ev.figure(fig, "variance", "Residual-stream variance of a Pre-LN DecoderLM at initialisation, without and with "
              "GPT-2's 1/√(2L) scaling: at the top of stacks of L layers (left), and layer by layer in a 32-layer stack.")


# --8<-- [start:test_variance]
@pytest.mark.claim("C-INIT-1", "confirmed")
def test_gpt2_scaling_keeps_the_stream_variance_flat_in_depth(ev, seed):
    """At initialisation the Pre-LN residual stream's variance grows linearly with depth without the scaling
    (growth exponent ≈ 1) and stays flat with 1/√(2L) (exponent ≈ 0). Would be refuted if the scaled stream
    still grew with L."""
    arms = {"none": {}, "gpt2": {}}
    for init in arms:
        arms[init] = {L: stream_variance(seed, L, init) for L in DEPTHS}
    finals = {init: [arms[init][L][-1] for L in DEPTHS] for init in arms}
    exps = {init: growth_exponent(DEPTHS, [f - 1 for f in finals[init]]) for init in arms}
    ev.record(f"Var(x_L)/Var(x_0) for L = {DEPTHS}, no scaling", finals["none"], expect="grows ∝ L")
    ev.record(f"Var(x_L)/Var(x_0) for L = {DEPTHS}, 1/√(2L)", finals["gpt2"], expect="flat")
    ev.record("growth exponent of the added variance, no scaling", exps["none"], expect="≈ 1 (linear)")
    ev.record("growth exponent of the added variance, 1/√(2L)", exps["gpt2"], expect="≈ 0 (flat)")
    ev.record("Var(x_32)/Var(x_0), no scaling / 1/√(2L)", [finals["none"][-1], finals["gpt2"][-1]], key=False)
    _plot_variance(ev, {"final": {("no scaling", "C0"): finals["none"], ("1/√(2L)", "C3"): finals["gpt2"]},
                        "profile": {("no scaling", "C0"): arms["none"][32], ("1/√(2L)", "C3"): arms["gpt2"][32]}})
    # over seeds 100-139: exponents 1.148 ± 0.042 (no scaling) and 0.022 ± 0.052 (gpt2); bounds beyond 4 SD
    assert exps["none"] > 0.8 and abs(exps["gpt2"]) < 0.3
    assert finals["none"][-1] > 5 * finals["gpt2"][-1]
# --8<-- [end:test_variance]


@pytest.mark.claim("C-DEEPNORM-1", "confirmed")
def test_deep_post_ln_failure_is_the_learning_rate_and_deepnorm_moves_less(ev, seed):
    """The controls: at lr 1e-3 the same 8-layer Post-LN stack does learn, so at 1e-2 it is the step size that
    breaks it; and one Adam step at lr 1e-2 moves DeepNorm's output less than plain Post-LN's (DeepNet's argument:
    bounded early updates). Would be refuted if Post-LN failed at 1e-3 too, or DeepNorm's first step were as large."""
    low = deep_run(seed, LOW_LR)
    ev.record("accuracy after 80 steps, Post-LN, 8 layers, lr 1e-3", low["accuracy"], expect="learns (most of the table)")
    change = {"post": first_step_change(seed), "deepnorm": first_step_change(seed, depth_init="deepnorm")}
    ev.record("relative change of the output after one Adam step at lr 1e-2, Post-LN / DeepNorm (mean of 4 inits)",
              [change["post"], change["deepnorm"]], expect="DeepNorm smaller")
    ev.record("DeepNorm's first-step change / Post-LN's", change["deepnorm"] / change["post"], expect="< 1")
    # over seeds 100-139: low-lr Post-LN accuracy 0.92 ± 0.12 (min 0.45), bound 0.3 at 5 SD; DeepNorm / Post-LN
    # first-step change 0.558 ± 0.032 (max 0.614), bound 0.85 at 9 SD
    assert low["accuracy"] > 0.3
    assert change["deepnorm"] < 0.85 * change["post"]


# --8<-- [start:test_deepnorm]
@pytest.mark.claim("C-DEEPNORM-1", "confirmed")
def test_deepnorm_trains_a_deep_post_ln_stack_where_post_ln_stalls(ev, seed):
    """8 Post-LN layers, lr 1e-2, no warm-up: plain Post-LN stays at chance accuracy on the lookup task, the same
    stack with DeepNorm learns it. Would be refuted if DeepNorm stalled too, or if Post-LN trained as well."""
    post, deep = deep_run(seed, HIGH_LR), deep_run(seed, HIGH_LR, depth_init="deepnorm")
    alpha, beta = deepnorm_constants(DEEP, 0, "single")
    ev.record("DeepNorm α, β for an 8-layer encoder-only stack", [alpha, beta], expect="(2N)^¼ = 2, (8N)^-¼ ≈ 0.354")
    ev.record("accuracy after 80 steps, Post-LN, 8 layers, lr 1e-2", post["accuracy"], expect="chance (1/15)")
    ev.record("accuracy after 80 steps, DeepNorm, 8 layers, lr 1e-2", deep["accuracy"], expect="learns")
    ev.record("final training loss, Post-LN / DeepNorm", [post["final_loss"], deep["final_loss"]], key=False)
    # over seeds 100-139: Post-LN accuracy 0.069 ± 0.009 (max 0.114), DeepNorm 1.0 on every seed
    assert post["accuracy"] < 0.3 and deep["accuracy"] > 0.9
    assert alpha == pytest.approx(2.0) and beta == pytest.approx(64 ** -0.25)
# --8<-- [end:test_deepnorm]
