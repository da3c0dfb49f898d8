# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% [markdown]
# # Does LayerNorm (with residuals) prevent over-fitting?
#
# Proofs for the page `docs/normalisation/does-layernorm-prevent-overfitting.md`.
# Every function builds the shared module (`proofs/transformer/`) and flips one
# switch: `norm` ("layer", or "none"; "batch" only to contrast batch noise) or
# `residual` (True / False). Dropout is off everywhere except in the one arm
# that shows what a regulariser does.
# Run it with `pytest proofs/normalisation/proof_ln_overfitting.py`.

# %%
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from proofs.tasks import lookup_task, random_tokens
from proofs.train import accuracy, train
from proofs.transformer import EncoderTagger, TransformerConfig

V = 16  # vocabulary: token 0 is padding, 1..15 are real tokens


def tiny(**switches) -> TransformerConfig:
    return TransformerConfig(vocab_size=V, d_model=32, n_heads=4, d_ff=64, n_layers=2,
                             dropout_emb=0.0, dropout_residual=0.0).replace(**switches)


# %% [markdown]
# ## 1. Is there any noise in LayerNorm?
#
# A regulariser such as dropout, or BatchNorm's batch statistics, makes the
# training-time output of an example random. We feed the same sequence inside two
# different batches, in training mode, and compare its outputs.

# %%
# --8<-- [start:batch_noise]
def same_sequence_two_batches(seed: int, **switches) -> float:
    """Largest change in one sequence's logits when its batch-mates change (training mode, dropout off)."""
    g = torch.Generator().manual_seed(seed)
    seq = random_tokens(g, 1, 12, V)
    batch_a = torch.cat([seq, random_tokens(g, 7, 12, V)])
    batch_b = torch.cat([seq, random_tokens(g, 15, 12, V)])
    torch.manual_seed(seed)
    model = EncoderTagger(tiny(**switches)).train()
    with torch.no_grad():
        return (model(batch_a)[0] - model(batch_b)[0]).abs().max().item()
# --8<-- [end:batch_noise]


# %% [markdown]
# ## 2. A task that over-fits
#
# A per-token lookup (target = lookup_table[token], see proofs/tasks.py) whose training labels are replaced by a
# random token 30 % of the time; 32 training sequences, seen 50 times each (Adam, lr 1e-2), one layer. A model
# that memorises the noise reaches 100 % on the training set, and does worse on
# fresh sequences drawn the same way (their best possible accuracy is about 72 %:
# 70 % clean labels plus the noise that lands on the right token by chance).

# %%
# --8<-- [start:overfit]
def noisy_lookup(g: torch.Generator, n: int, length: int = 8, noise: float = 0.3):
    """The lookup task with 30 % of labels replaced at random (see proofs/tasks.py)."""
    return lookup_task(g, n, length, V, noise)


@torch.no_grad()
def nll_and_confidence(model, x, y) -> tuple[float, float]:
    model.eval()
    logits = model(x).reshape(-1, V)
    return F.cross_entropy(logits, y.reshape(-1)).item(), logits.softmax(-1).max(-1).values.mean().item()


def overfit_run(seed: int, steps: int = 50, **switches) -> dict:
    xt, yt = noisy_lookup(torch.Generator().manual_seed(seed), 32)
    xv, yv = noisy_lookup(torch.Generator().manual_seed(10_000 + seed), 512)
    torch.manual_seed(seed)
    model = EncoderTagger(tiny(n_layers=1, **switches))  # one layer: the over-fitting needs no depth
    train(model, lambda step: (xt, yt), steps, lr=1e-2)
    train_nll, _ = nll_and_confidence(model, xt, yt)
    val_nll, val_conf = nll_and_confidence(model, xv, yv)
    return {"train_acc": accuracy(model, xt, yt), "val_acc": accuracy(model, xv, yv), "train_nll": train_nll,
            "val_nll": val_nll, "gap": val_nll - train_nll, "val_conf": val_conf}
# --8<-- [end:overfit]


ARMS = {"LayerNorm + residual": {}, "no LayerNorm": {"norm": "none"}, "no residual": {"residual": False},
        "LayerNorm + residual + dropout 0.1": {"dropout_emb": 0.1, "dropout_residual": 0.1}}


# %%
if __name__ == "__main__":
    print("LayerNorm", same_sequence_two_batches(0), "BatchNorm", same_sequence_two_batches(0, norm="batch"))
    for arm, sw in ARMS.items():
        print(arm, overfit_run(0, **sw))


# %% [markdown]
# ## Tests

# %%
# --8<-- [start:test_noise]
@pytest.mark.claim("C-LN-3", "refuted")
def test_layernorm_output_does_not_depend_on_the_batch(ev, seed):
    """In training mode a sequence's output is the same whatever its batch-mates under LayerNorm; under BatchNorm
    it changes. LayerNorm injects no noise, so it cannot regularise the way batch noise or dropout does."""
    seeds = [seed, seed + 1, seed + 2]
    ln = [same_sequence_two_batches(s) for s in seeds]
    bn = [same_sequence_two_batches(s, norm="batch") for s in seeds]
    ev.record("max change of one sequence's logits between two batches, LayerNorm (3 seeds)", ln,
              expect="0 (float rounding)")
    ev.record("the same, norm='batch' (3 seeds)", bn, expect="changes: batch statistics")
    torch.manual_seed(seed)
    model = EncoderTagger(tiny())
    ids = random_tokens(torch.Generator().manual_seed(seed), 8, 12, V)
    with torch.no_grad():
        train_vs_eval = (model.train()(ids) - model.eval()(ids)).abs().max().item()
    ev.record("LayerNorm model: max |training-mode − eval-mode output|", train_vs_eval, expect="0: nothing random")
    assert max(ln) < 1e-5 and min(bn) > 0.05 and train_vs_eval < 1e-6
# --8<-- [end:test_noise]


def _plot(ev, table):
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 3.4))
    for i, (arm, t) in enumerate(table.items()):
        ax.scatter([i] * 3, t["train_nll"], color="C1", marker="x", label="training" if i == 0 else None)
        ax.scatter([i] * 3, t["val_nll"], color="C0", label="held-out" if i == 0 else None)
    ax.set_xticks(range(len(table)), [a.replace(" (", "\n(") for a in table], fontsize=7)
    ax.set(title="cross-entropy after 50 steps on 32 noisy sequences (3 seeds)", ylabel="NLL")
    ax.legend(fontsize=8)
    fig.tight_layout()
    ev.figure(fig, "gaps", "Training and held-out loss with and without LayerNorm and residuals; dropout for contrast.")


# --8<-- [start:test_overfit]
@pytest.mark.claim("C-LN-3", "refuted")
def test_layernorm_and_residuals_do_not_prevent_overfitting(ev, seed):
    """With LayerNorm and residuals the model memorises the noisy training labels; removing either does not make it
    over-fit less; dropout, a real regulariser, does. Would refute "LayerNorm/residuals do not prevent over-fitting"
    if removing them shrank the held-out − training gap, or if the model with them did not over-fit at all."""
    seeds = [seed, seed + 1, seed + 2]
    table = {}
    for arm, sw in ARMS.items():
        runs = [overfit_run(s, **sw) for s in seeds]
        table[arm] = {k: [r[k] for r in runs] for k in runs[0]}
    _plot(ev, table)
    for arm, t in table.items():
        ev.record(f"{arm}: train accuracy (3 seeds)", t["train_acc"], key=arm.startswith("LayerNorm"))
        ev.record(f"{arm}: held-out accuracy (3 seeds)", t["val_acc"], key=False)
        ev.record(f"{arm}: held-out − training NLL (3 seeds)", t["gap"])
        ev.record(f"{arm}: mean confidence on held-out tokens (3 seeds)", t["val_conf"], key=False)
    paper, no_ln, no_res = table["LayerNorm + residual"], table["no LayerNorm"], table["no residual"]
    drop = table["LayerNorm + residual + dropout 0.1"]

    def paired(a, b, key="gap"):  # mean over the seeds of a − b, paired by seed
        return sum(x - y for x, y in zip(a[key], b[key])) / len(seeds)

    diffs = {"no LN": paired(no_ln, paper), "no res": paired(no_res, paper), "dropout": paired(paper, drop)}
    ev.record("gap, no LayerNorm − LayerNorm + residual (mean of 3 paired seeds)", diffs["no LN"], expect="≥ 0", key=False)
    ev.record("gap, no residual − LayerNorm + residual (mean of 3 paired seeds)", diffs["no res"], expect="> −0.2", key=False)
    ev.record("gap, LayerNorm + residual − with dropout (mean of 3 paired seeds)", diffs["dropout"], expect="> 0",
              key=False)
    # Thresholds from seeds 100-139 (three paired seeds each): paper arm train accuracy >= 0.957, held-out <= 0.571,
    # gap 2.91 ± 0.18; gap without LayerNorm minus the paper arm's 5.2 ± 0.41; without residuals 0.43 ± 0.15 (one
    # window of 40 at -0.05: "does not shrink" is asserted, not "always widens"); dropout shrinks it by 1.07 ± 0.09.
    assert min(paper["train_acc"]) > 0.9 and max(paper["val_acc"]) < 0.7 and min(paper["gap"]) > 1.0  # over-fits
    # the ablations over-fit at least as much: LayerNorm and residuals are not what limits it
    assert min(no_ln["train_acc"]) > 0.9 and min(no_res["train_acc"]) > 0.9
    assert diffs["no LN"] > 1.0 and diffs["no res"] > -0.2
    # a regulariser shrinks the gap and costs training fit
    assert diffs["dropout"] > 0.5 and sum(drop["train_acc"]) < sum(paper["train_acc"])
# --8<-- [end:test_overfit]
