# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% [markdown]
# # Why multiply the embeddings by √d_model?
#
# Proofs for the page `docs/positions/why-scale-embeddings.md`. Every function
# builds on the shared module (`proofs/transformer/`) and flips two switches
# of its `Embeddings`: `scale_embeddings` (True / False) and `emb_init`
# ("normal_inv_sqrt_d" = N(0, 1/d_model) as in tensor2tensor, "normal_1" =
# N(0, 1) as `torch.nn.Embedding`). The answer depends on both.
# Run it with `pytest proofs/positions/proof_embedding_scale.py`, or open it as a
# notebook with `jupytext --to notebook proofs/positions/proof_embedding_scale.py`.

# %%
from __future__ import annotations

import math

import torch

from proofs.tasks import copy_task, reverse_task
from proofs.train import accuracy, fixed_batches, token_loss, train
from proofs.transformer import EncoderTagger, Embeddings, TransformerConfig

D_MODELS = [16, 64, 256, 512, 1024]  # widths swept by the ratio measurement
# the four combinations of the two switches, in the order the page's figure shows them
ARMS = {
    "×√d, N(0,1/d) (paper)": dict(scale_embeddings=True, emb_init="normal_inv_sqrt_d"),
    "no factor, N(0,1/d)": dict(scale_embeddings=False, emb_init="normal_inv_sqrt_d"),
    "no factor, N(0,1)": dict(scale_embeddings=False, emb_init="normal_1"),
    "×√d, N(0,1)": dict(scale_embeddings=True, emb_init="normal_1"),
}


# %% [markdown]
# ## 1. How big is the token vector next to the position vector?
#
# One `Embeddings` module (dropout off), a vocabulary of 256 tokens, 32 positions.
# Its output is token part + PE; we subtract the module's own PE to get the
# token part and compare the two lengths, token by token and position by position.
# ‖PE(pos)‖ is the same for every position: each (sin, cos) pair has length 1,
# so ‖PE‖ = √(d/2).

# %%
# --8<-- [start:ratio]
def token_to_position_ratio(d_model: int, seed: int, **switches) -> dict:
    """Median ‖token part‖ / ‖PE(pos)‖ of the embedding layer's output, over 256 tokens x 32 positions."""
    torch.manual_seed(seed)
    cfg = TransformerConfig(vocab_size=256, d_model=d_model, n_heads=1, max_len=32, dropout_emb=0.0, **switches)
    emb = Embeddings(cfg, cfg.vocab_size).eval()
    ids = torch.arange(256)[:, None].expand(256, 32)  # every token at every position
    with torch.no_grad():
        out = emb(ids)  # (V, T, C) = token part + PE
        pe = emb.positions(32)  # (T, C)
    tok = out - pe
    ratio = tok.norm(dim=-1) / pe.norm(dim=-1)  # (V, T)
    return {"ratio": ratio.median().item(), "pe_norm": pe.norm(dim=-1).mean().item(),
            "tok_norm": tok.norm(dim=-1).mean().item()}
# --8<-- [end:ratio]


def tied_logit_std(seed: int, d_model: int = 64, **switches) -> float:
    """Std of the initial logits h·Eᵀ when the embedding matrix is also the output layer (tie_embeddings='all')."""
    torch.manual_seed(seed)
    cfg = TransformerConfig(vocab_size=64, d_model=d_model, n_heads=4, n_layers=1, dropout_emb=0.0,
                            dropout_residual=0.0, **switches)
    model = EncoderTagger(cfg).eval()
    with torch.no_grad():
        return model(torch.randint(0, 64, (32, 16))).std().item()


# %% [markdown]
# ## 2. Does the ratio decide whether a small model can use positions?
#
# A 1-layer encoder (d_model = 32) learns to reverse a sequence, which it can only
# do by position; the copy task needs no position and is the control. The output
# layer is untied (`tie_embeddings="none"`) so that `emb_init` changes the input
# side only, and dropout is off. Same seeds and batches for all four arms.

# %%
# --8<-- [start:train]
def task_accuracy(seed: int, task=reverse_task, steps: int = 200, d_model: int = 32, **switches) -> float:
    torch.manual_seed(seed)
    cfg = TransformerConfig(vocab_size=16, d_model=d_model, n_heads=4, d_ff=2 * d_model, n_layers=1,
                            tie_embeddings="none", dropout_emb=0.0, dropout_residual=0.0, **switches)
    model = EncoderTagger(cfg)
    train(model, fixed_batches(task, 1000 + seed, batch=32, length=10, vocab=16), steps, lr=2e-3)
    x, y = task(torch.Generator().manual_seed(10_000 + seed), 512, 10, 16)
    return accuracy(model, x, y)
# --8<-- [end:train]


# %% [markdown]
# ## 3. What does the factor do to the gradient?
#
# A 6-layer encoder (the paper's depth, d_model = 64), one batch, one backward pass.
# We read the gradient that arrives at the embedding layer's output and at the top of
# the stack (so we can see whether anything vanishes on the way down), the gradient
# of the embedding matrix itself, and the median gradient of the layers' weight
# matrices. Then one Adam step: how far do E and the scaled embedding move?

# %%
# --8<-- [start:grad]
def gradient_report(seed: int, d_model: int = 64, lr: float = 1e-3, **switches) -> dict:
    torch.manual_seed(seed)
    cfg = TransformerConfig(vocab_size=16, d_model=d_model, n_heads=4, d_ff=2 * d_model, n_layers=6,
                            tie_embeddings="none", dropout_emb=0.0, dropout_residual=0.0, **switches)
    model = EncoderTagger(cfg)
    seen = {}

    def keep(name):
        def hook(module, inputs, out):
            out.retain_grad()
            seen[name] = out
        return hook

    model.embed.register_forward_hook(keep("bottom"))  # embedding output, the input of layer 1
    model.encoder.register_forward_hook(keep("top"))  # output of layer 6
    x, y = reverse_task(torch.Generator().manual_seed(seed), 64, 16, 16)
    token_loss(model(x), y).backward()
    rms = lambda t: t.pow(2).mean().sqrt().item()  # noqa: E731
    layer_w = sorted(rms(p.grad) for n, p in model.named_parameters() if p.dim() == 2 and ".tok." not in f".{n}")
    E = model.embed.tok.weight
    before = E.detach().clone()
    torch.optim.Adam([E], lr=lr, betas=(0.9, 0.98), eps=1e-9).step()  # the trainer's Adam, one step on E only
    step = E.detach() - before
    factor = math.sqrt(d_model) if cfg.scale_embeddings else 1.0
    return {
        "grad_bottom": rms(seen["bottom"].grad), "grad_top": rms(seen["top"].grad),
        "grad_E": rms(E.grad), "grad_layers_median": layer_w[len(layer_w) // 2],
        "adam_step_E": rms(step), "adam_step_scaled": rms(step * factor),  # how far E, and what layer 1 sees, move
    }
# --8<-- [end:grad]


# %%
if __name__ == "__main__":  # notebook / script: flip a switch above and rerun
    for d in D_MODELS:
        print(d, {arm: round(token_to_position_ratio(d, 0, **sw)["ratio"], 3) for arm, sw in ARMS.items()})
    for arm, sw in ARMS.items():
        print(arm, "reverse", task_accuracy(0, **sw), "grad", gradient_report(0, **sw))


# %% [markdown]
# ## Tests: each asserts the difference the switches make

# %%
import pytest  # noqa: E402

SQRT2 = math.sqrt(2)


def _plot_ratio(ev, table):
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 3.4))
    for (arm, _), style in zip(ARMS.items(), ("o-", "s--", "^-.", "d:")):
        ax.loglog(D_MODELS, [table[arm][d] for d in D_MODELS], style, label=arm)
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set(xlabel="d_model", ylabel="‖token part‖ / ‖PE‖", title="token vs position signal at the input")
    ax.legend(fontsize=8)
    fig.tight_layout()
    ev.figure(fig, "ratio", "Median length of the token part over the length of the PE, for the two switches "
                            "(×√d_model on/off) and the two initialisations, against d_model. The two √2 lines coincide: "
                            "the same random draws give the same product.")


@pytest.mark.claim("C-EMB-1", "nuanced")
@pytest.mark.claim("C-FOLK-1", "nuanced")
def test_factor_matches_pe_scale_only_under_small_init(ev, seed):
    """×√d_model puts the token vector at the PE's scale (ratio √2 at every width) only if E starts at N(0, 1/d_model)."""
    table = {arm: {} for arm in ARMS}
    for d in D_MODELS:
        for arm, sw in ARMS.items():
            r = token_to_position_ratio(d, seed, **sw)
            table[arm][d] = r["ratio"]
            if arm == "×√d, N(0,1/d) (paper)":
                ev.record(f"‖PE(pos)‖ at d={d}", r["pe_norm"], expect=f"√(d/2) = {math.sqrt(d / 2):.2f}", key=False)
                assert r["pe_norm"] == pytest.approx(math.sqrt(d / 2), rel=1e-5)
    _plot_ratio(ev, table)
    for arm, expect in (("×√d, N(0,1/d) (paper)", "≈ √2 at every d"), ("×√d, N(0,1)", "≈ √(2d): grows with d"),
                        ("no factor, N(0,1/d)", "≈ 1/√(d/2): shrinks with d"), ("no factor, N(0,1)", "≈ √2 at every d")):
        for d in (64, 512):
            ev.record(f"ratio {arm}, d={d}", table[arm][d], expect=expect, key=d == 512)
    for d in D_MODELS:
        assert table["×√d, N(0,1/d) (paper)"][d] == pytest.approx(SQRT2, rel=0.08)
        assert table["no factor, N(0,1)"][d] == pytest.approx(SQRT2, rel=0.08)
        assert table["×√d, N(0,1)"][d] == pytest.approx(math.sqrt(2 * d), rel=0.08)
        assert table["no factor, N(0,1/d)"][d] == pytest.approx(1 / math.sqrt(d / 2), rel=0.08)


@pytest.mark.claim("C-EMB-1", "nuanced")
def test_small_init_is_for_the_tied_output_layer(ev, seed):
    """With tied weights E is also the output layer: N(0, 1/d_model) keeps the initial logits near unit scale."""
    small = tied_logit_std(seed, emb_init="normal_inv_sqrt_d")
    big = tied_logit_std(seed, emb_init="normal_1")
    ev.record("std of initial logits, tied, N(0,1/d), d=64", small, expect="≈ 1")
    ev.record("std of initial logits, tied, N(0,1), d=64", big, expect="≈ √d = 8")
    assert 0.7 < small < 1.4
    assert big / small == pytest.approx(8.0, rel=0.15)


def _plot_training(ev, acc):
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 3.2))
    names = list(ARMS)
    for i, arm in enumerate(names):
        ax.scatter([i] * len(acc[arm]), acc[arm], color="C0", zorder=3)
        ax.bar(i, min(acc[arm]), color="C0", alpha=0.3)
    ax.axhline(1 / 15, color="grey", ls=":", label="chance (1/15)")
    ax.set_xticks(range(len(names)), [n.replace(", ", ",\n") for n in names], fontsize=8)
    ax.set(ylabel="reverse accuracy", ylim=(0, 1.05), title="reverse task, 1-layer encoder, d_model=32, 200 steps")
    ax.legend(fontsize=8)
    fig.tight_layout()
    ev.figure(fig, "reverse", "Reverse-task accuracy for the four combinations (dots: 3 seeds, bar: worst seed). "
                              "Token/PE length ratio at d_model=32: paper √2, no factor with N(0,1/d) 1/4, "
                              "no factor with N(0,1) √2, ×√d with N(0,1) 8.")


# --8<-- [start:test_training]
@pytest.mark.claim("C-EMB-1", "nuanced")
def test_ratio_decides_whether_positions_are_used(ev, seed):
    """A token vector far larger than the PE stops a small model from using position; a smaller one does not hurt here."""
    seeds = [seed, seed + 1, seed + 2]
    acc = {arm: [task_accuracy(s, **sw) for s in seeds] for arm, sw in ARMS.items()}
    copy_big = [task_accuracy(s, task=copy_task, steps=100, **ARMS["×√d, N(0,1)"]) for s in seeds]
    _plot_training(ev, acc)
    for arm in ARMS:
        ev.record(f"reverse accuracy, {arm} (3 seeds)", acc[arm])
    ev.record("copy accuracy, ×√d, N(0,1) (3 seeds)", copy_big, expect="≈ 1: tokens are fine, positions are lost")
    paper, big = acc["×√d, N(0,1/d) (paper)"], acc["×√d, N(0,1)"]
    small, same_ratio = acc["no factor, N(0,1/d)"], acc["no factor, N(0,1)"]
    assert max(big) < 0.25 and min(copy_big) > 0.95  # PE swamped: no position, but tokens still readable
    assert min(paper) > max(big) + 0.15 and min(same_ratio) > max(big) + 0.15  # ratio √2 (either way): learns
    assert min(small) > max(paper)  # a token vector 4x smaller than the PE was not "drowned": it learned faster
# --8<-- [end:test_training]


# --8<-- [start:test_gradient]
@pytest.mark.claim("C-EMB-2", "refuted")
@pytest.mark.claim("C-FOLK-1", "nuanced")
def test_factor_rescales_gradient_nothing_vanishes(ev, seed):
    """The factor multiplies E's gradient by √d (chain rule); nothing vanishes without it, and Adam's step ignores the scale."""
    d = 64
    paper = gradient_report(seed, d_model=d, **ARMS["×√d, N(0,1/d) (paper)"])
    off = gradient_report(seed, d_model=d, **ARMS["no factor, N(0,1/d)"])
    same_fn = gradient_report(seed, d_model=d, **ARMS["no factor, N(0,1)"])  # the paper's function, E stored ×√d
    for name, r in (("×√d", paper), ("no factor", off)):
        ev.record(f"gradient at layer-1 input / at layer-6 output, {name}", r["grad_bottom"] / r["grad_top"],
                  expect="≈ 1: nothing vanishes through 6 layers")
        ev.record(f"RMS gradient of E / median RMS gradient of layer weights, {name}",
                  r["grad_E"] / r["grad_layers_median"], expect="order 1 (no vanishing)")
    ev.record("grad E, ×√d with N(0,1/d) / grad E, no factor with N(0,1)", paper["grad_E"] / same_fn["grad_E"],
              expect="= √d = 8 exactly: same function, E stored √d smaller")
    ev.record("Adam step on E, ×√d / no factor", paper["adam_step_E"] / off["adam_step_E"],
              expect="= 1: Adam's step does not depend on the gradient's scale")
    ev.record("Adam step on what layer 1 sees, ×√d / no factor", paper["adam_step_scaled"] / off["adam_step_scaled"],
              expect="= √d: the factor is a √d larger learning rate for the embedding")
    for r in (paper, off):
        assert 0.3 < r["grad_bottom"] / r["grad_top"] < 3
        assert 0.05 < r["grad_E"] / r["grad_layers_median"] < 20
    assert paper["grad_bottom"] == pytest.approx(same_fn["grad_bottom"], rel=1e-4)  # same forward, same gradient
    assert paper["grad_E"] / same_fn["grad_E"] == pytest.approx(math.sqrt(d), rel=1e-4)
    assert paper["adam_step_E"] == pytest.approx(off["adam_step_E"], rel=1e-3)
    assert paper["adam_step_scaled"] / off["adam_step_scaled"] == pytest.approx(math.sqrt(d), rel=1e-3)
# --8<-- [end:test_gradient]
