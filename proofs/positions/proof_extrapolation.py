# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% [markdown]
# # Sinusoidal or learned positions? Do they extrapolate?
#
# Proofs for the page `docs/positions/learned-vs-sinusoidal.md`. Every function
# builds on the shared module (`proofs/transformer/`) and flips one switch:
# `positions` = "sinusoidal" (the paper's fixed table) or "learned" (a trained
# table of `max_len` rows, initialised N(0, 1)).
# Run it with `pytest proofs/positions/proof_extrapolation.py`, or open it as a
# notebook with `jupytext --to notebook proofs/positions/proof_extrapolation.py`.

# %%
from __future__ import annotations

from functools import lru_cache

import torch

from proofs.tasks import previous_token_task
from proofs.train import fixed_batches, train
from proofs.transformer import ConfigError, EncoderTagger, TransformerConfig, sinusoidal_table

TRAIN_LEN = 16  # every training sequence has this length
TEST_LENS = (16, 32, 64)  # evaluated at the training length, then 2x and 4x longer
CHANCE = 1 / 15  # tokens are uniform over 15 values


# %% [markdown]
# ## 1. The task and the two arms
#
# The previous-token task: the target at position t is the input at t−1. It is
# defined at every length and depends on a fixed offset only, which is the friendliest
# case for sinusoids: their shift by one position is one fixed rotation (see the
# sinusoidal page). A 2-layer bidirectional encoder (d_model 64, dropout off) must
# tell its left neighbour from its right one, which it can only do through positions.
# Both arms train 250 steps on length-16 sequences, same seeds and batches.
# The learned table has 64 rows, so the model can *run* on longer inputs; rows 16-63
# are never used in training.

# %%
# --8<-- [start:train]
@lru_cache(maxsize=None)
def trained_tagger(seed: int, positions: str, steps: int = 250) -> tuple[EncoderTagger, torch.Tensor | None]:
    """A model trained on length-16 sequences, and (learned arm) its position table before training."""
    torch.manual_seed(seed)
    cfg = TransformerConfig(vocab_size=16, d_model=64, n_heads=4, d_ff=128, n_layers=2, max_len=64,
                            dropout_emb=0.0, dropout_residual=0.0, positions=positions)
    model = EncoderTagger(cfg)
    table_before = model.embed.pos.detach().clone() if positions == "learned" else None
    train(model, fixed_batches(previous_token_task, 1000 + seed, batch=32, length=TRAIN_LEN, vocab=16), steps, lr=2e-3)
    return model, table_before


@torch.no_grad()
def accuracy_by_position(model: EncoderTagger, length: int, seed: int) -> torch.Tensor:
    """(length,) accuracy at each position over 256 fresh sequences of that length."""
    x, y = previous_token_task(torch.Generator().manual_seed(10_000 + seed), 256, length, 16)
    model.eval()
    return (model(x).argmax(-1) == y).float().mean(0)
# --8<-- [end:train]


# %%
if __name__ == "__main__":  # notebook / script: flip a switch above and rerun
    for arm in ("sinusoidal", "learned"):
        model, _ = trained_tagger(0, arm)
        for L in TEST_LENS:
            acc = accuracy_by_position(model, L, 0)
            print(arm, L, "inside", acc[:TRAIN_LEN].mean().item(), "beyond", acc[TRAIN_LEN:].mean().item())


# %% [markdown]
# ## Tests

# %%
import pytest  # noqa: E402

def SEEDS(seed: int) -> list[int]:
    return [seed, seed + 1, seed + 2]  # statistical claims: three seeds, worst case asserted


# --8<-- [start:test_table]
@pytest.mark.claim("C-PE-5", "confirmed")
def test_learned_table_has_no_row_past_max_len(ev, seed):
    """A learned table stops at max_len (a clear error), and rows past the training length never receive gradient."""
    short = EncoderTagger(TransformerConfig(vocab_size=16, d_model=64, n_heads=4, positions="learned", max_len=16))
    with pytest.raises(ConfigError) as err:
        short(torch.ones(1, 32, dtype=torch.long))
    ev.record("learned table with max_len=16, input of length 32", f"ConfigError: {err.value}")
    model, before = trained_tagger(seed, "learned")
    after = model.embed.pos.detach()
    moved = (after - before).norm(dim=1)  # (64,) how far each row moved in training
    ev.record("rows 0-15: mean change during training", moved[:TRAIN_LEN].mean().item(), expect="> 0: trained")
    ev.record("rows 16-63: largest change during training", moved[TRAIN_LEN:].max().item(), expect="0: never used")
    assert "exceeds the learned position table" in str(err.value)
    assert moved[:TRAIN_LEN].min().item() > 0 and moved[TRAIN_LEN:].max().item() == 0.0
# --8<-- [end:test_table]


@pytest.mark.claim("C-PE-5", "confirmed")
def test_same_accuracy_in_distribution(ev, seed):
    """At the training length both kinds of position learn the task."""
    acc = {arm: [accuracy_by_position(trained_tagger(s, arm)[0], TRAIN_LEN, s).mean().item() for s in SEEDS(seed)]
           for arm in ("sinusoidal", "learned")}
    for arm, a in acc.items():
        ev.record(f"accuracy at length 16, {arm} (3 seeds)", a, expect="≈ 1")
    assert min(acc["sinusoidal"]) > 0.95 and min(acc["learned"]) > 0.95


def _plot_by_position(ev, curves):
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.4))
    for (arm, rows), color in zip(curves.items(), ("C0", "C3")):
        for i, row in enumerate(rows):
            ax.plot(range(len(row)), row.numpy(), color=color, alpha=0.7, label=arm if i == 0 else None)
    ax.axvspan(-0.5, TRAIN_LEN - 0.5, color="grey", alpha=0.12, label="positions seen in training")
    ax.axhline(CHANCE, color="grey", ls=":", label="chance (1/15)")
    ax.set(xlabel="position in a length-64 test sequence", ylabel="accuracy", ylim=(0, 1.05),
           title="previous-token task, trained on length 16")
    ax.legend(fontsize=8, loc="center right")
    fig.tight_layout()
    ev.figure(fig, "by_position", "Accuracy at each position of length-64 test sequences, for models trained on "
                                  "length 16 only (3 seeds per arm).")


# --8<-- [start:test_extrapolation]
@pytest.mark.claim("C-PE-3", "nuanced")
@pytest.mark.claim("C-FOLK-10", "refuted")
def test_bounded_values_do_not_extrapolate(ev, seed):
    """PE stays in [−1, 1] at any length, yet past the training length both models fall to near chance."""
    pe = sinusoidal_table(100_000, 64)
    ev.record("max |PE| over 100 000 positions", pe.abs().max().item(), expect="≤ 1: bounded")
    ev.record("spread of ‖PE(pos)‖ over 100 000 positions", (pe.norm(dim=1).max() - pe.norm(dim=1).min()).item(),
              expect="≈ 0: every position has length √(d/2)")
    assert pe.abs().max().item() <= 1.0
    by_pos = {(arm, L): [accuracy_by_position(trained_tagger(s, arm)[0], L, s) for s in SEEDS(seed)]
              for arm in ("sinusoidal", "learned") for L in TEST_LENS[1:]}
    _plot_by_position(ev, {arm: by_pos[arm, 64] for arm in ("sinusoidal", "learned")})
    res = {}
    for arm in ("sinusoidal", "learned"):
        beyond, inside = {}, {}
        for L in TEST_LENS[1:]:
            accs = by_pos[arm, L]
            beyond[L] = [a[TRAIN_LEN:].mean().item() for a in accs]
            inside[L] = [a[:TRAIN_LEN].mean().item() for a in accs]
            ev.record(f"{arm}: accuracy at positions 16-{L - 1}, length {L} (3 seeds)", beyond[L],
                      expect=f"chance = {CHANCE:.3f} if nothing extrapolates")
            ev.record(f"{arm}: accuracy at positions 0-15, length {L} (3 seeds)", inside[L],
                      expect="< accuracy at length 16: unseen positions disturb the seen ones", key=L == 64)
        res[arm] = beyond
    for arm in res:
        assert max(res[arm][32]) < 0.3 and max(res[arm][64]) < 0.3  # far below the ≈ 1 reached at length 16
# --8<-- [end:test_extrapolation]
