# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% [markdown]
# # Which position schemes extrapolate?
#
# Proofs for the page `docs/relative/extrapolation.md`. ONE comparison: the same small
# causal language model (`DecoderLM` of the shared module), the same task, the same
# training steps, batches and seeds, and one switch flipped between the arms:
# `positions` = "sinusoidal", "learned", "none", "shaw", "xl", "t5", "rope" or "alibi".
# Every arm is trained on sequences of 32 tokens and tested on sequences of 32, 64
# and 128. The long-context page (`proof_long_context.py`) reuses the RoPE arm.
# Run it with `pytest proofs/relative/proof_extrapolation_today.py`, or open it as a
# notebook with `jupytext --to notebook proofs/relative/proof_extrapolation_today.py`.

# %%
from __future__ import annotations

from functools import cache

import torch

from proofs.length_runs import FACTORS, IGNORE, KEYS, TRAIN_LEN, VOCAB, eval_batch, last_key_task, trained
from proofs.transformer import ConfigError

# the eight arms: the name on the page -> cfg.positions
ARMS = {"sinusoidal": "sinusoidal", "learned": "learned", "none (causal mask only)": "none", "Shaw (clip 8)": "shaw",
        "Transformer-XL": "xl", "T5 bias": "t5", "RoPE": "rope", "ALiBi": "alibi"}



# %% [markdown]
# ## 1. The task: the most recent key
#
# Tokens are uniform over 1..15; tokens 1..4 are keys. At every position the target is
# the most recent key at or before it (no target before the first key). The rule is the
# same at every length, so extrapolation is well defined, and it needs order: the model
# must tell the latest key from the earlier ones. The latest key is usually a few tokens
# back (a key turns up 4 times in 15), so the answer always lies in a local window, and a
# longer input only adds older, irrelevant keys at distances never seen in training.
# Train: 70 Adam steps of 32 sequences of length 32, learning rate 0.01.

# %%
# The task, the shared configuration and the cached trained arms live in proofs/length_runs.py (the ALiBi/T5,
# RoPE-layout and long-context proofs reuse the same trained models).


# %% [markdown]
# ## 2. Accuracy past the training length
#
# One batch of 128 test sequences of length 128 (4x). Because the model is causal, the
# outputs at positions 0..63 of a length-128 input are exactly those of a length-64
# input. So "accuracy at 2x" is the accuracy on positions 32..63 (the block that ends at
# twice the training length) and "at 4x" on positions 96..127; "at 1x" is positions 0..31,
# the training distribution. A learned table has no row 32: the model refuses the input,
# and that is its result.

# %%
# --8<-- [start:evaluate]
def logits_in_chunks(model, ids: torch.Tensor, rows: int) -> torch.Tensor:
    """model(ids), computed `rows` sequences at a time, without gradients. The sequences of a batch never interact,
    so every number is the one a single call gives (every measurement of this file identical at seeds 0 and 4242);
    smaller pieces keep the (B, h, T, T) score tensors in cache: 1.4-1.8x faster on one CPU thread."""
    with torch.no_grad():
        return torch.cat([model(ids[i: i + rows]) for i in range(0, ids.shape[0], rows)])


@cache
def accuracy_by_position(positions: str, seed: int) -> torch.Tensor | str:
    """(4·TRAIN_LEN,) accuracy at each position (NaN where no target), or the error of a model that refuses."""
    model = trained(positions, seed).eval()
    ids, target = eval_batch(seed)
    try:
        pred = logits_in_chunks(model, ids, 32).argmax(-1)
    except ConfigError as err:  # a learned table: no row past max_len
        return str(err)
    valid = target != IGNORE
    return ((pred == target) & valid).sum(0) / valid.sum(0)


def block_accuracy(by_position: torch.Tensor | str, factor: int) -> float | None:
    """Accuracy on the TRAIN_LEN positions that end at factor x TRAIN_LEN (None: the model refused)."""
    if isinstance(by_position, str):
        return None
    block = by_position[(factor - 1) * TRAIN_LEN: factor * TRAIN_LEN]
    return block[~block.isnan()].mean().item()


def learned_at_train_length(seed: int) -> float:
    """The learned arm on length-32 inputs (the only length it accepts)."""
    model = trained("learned", seed).eval()
    ids, target = eval_batch(seed, TRAIN_LEN)
    with torch.no_grad():
        pred = model(ids).argmax(-1)
    valid = target != IGNORE
    return (((pred == target) & valid).sum() / valid.sum()).item()


def row_of(positions: str, seed: int) -> list[float | None]:
    """[accuracy at 1x, 2x, 4x] of one arm."""
    if positions == "learned":
        return [learned_at_train_length(seed), None, None]
    acc = accuracy_by_position(positions, seed)
    return [block_accuracy(acc, f) for f in FACTORS]


def table(seed: int) -> dict[str, list[float | None]]:
    """arm -> [accuracy at 1x, 2x, 4x]."""
    return {arm: row_of(positions, seed) for arm, positions in ARMS.items()}
# --8<-- [end:evaluate]


# %% [markdown]
# ## 3. What goes wrong at 4x, and how far back the arms still reach
#
# Two probes on the trained arms, no training:
#
# - **Cut the far context.** Recompute each prediction of the last block (positions
#   96..127) from the 32 tokens that end at it, as a fresh input. The answer of the task
#   lies in that window, and for a relative scheme the window is exactly a training input.
#   If this restores the 1x accuracy, the loss at 4x came from the tokens more than 32 back:
#   keys at offsets the model never saw. For an absolute scheme the cut also moves every
#   token back to positions 0..31, so it cannot tell far tokens from far positions.
# - **A lone key far back.** Filler everywhere and one key d tokens before the last
#   position: the target is that key. No other key competes, so a model that can attend
#   that far by content finds it. No arm was ever trained on a target more than about 32
#   back (the latest key is on average under 3 back), so a miss can come from the scheme
#   (ALiBi's penalty grows with d) or from what training never asked for; comparing the
#   arms that hold their accuracy (ALiBi, Shaw, Transformer-XL) separates the two only
#   in part.

# %%
# --8<-- [start:mechanism]
def windowed_accuracy(positions: str, seed: int, factor: int = 4) -> float:
    """Accuracy on the block that ends at factor x TRAIN_LEN when each query sees only its last TRAIN_LEN tokens."""
    model = trained(positions, seed).eval()
    ids, target = eval_batch(seed)
    ends = range((factor - 1) * TRAIN_LEN, factor * TRAIN_LEN)
    windows = torch.cat([ids[:, e - TRAIN_LEN + 1: e + 1] for e in ends])  # (32·B, TRAIN_LEN), each a fresh input
    wanted = torch.cat([target[:, e] for e in ends])
    pred = logits_in_chunks(model, windows, 512)[:, -1].argmax(-1)
    valid = wanted != IGNORE
    return ((pred == wanted) & valid).sum().item() / valid.sum().item()


LONE_KEY = (4, 16, 48, 96)  # distances back of the lone key


@cache
def lone_key_recall(positions: str, seed: int, distances=LONE_KEY, n: int = 128) -> list[float]:
    """Accuracy at the last position of length-128 filler sequences holding one key d tokens back."""
    model = trained(positions, seed).eval()
    g = torch.Generator().manual_seed(20_000 + seed)
    T, out = 4 * TRAIN_LEN, []
    for d in distances:
        ids = torch.randint(KEYS + 1, VOCAB, (n, T), generator=g)  # filler only
        key = torch.randint(1, KEYS + 1, (n,), generator=g)
        ids[:, T - 1 - d] = key
        out.append((logits_in_chunks(model, ids, 32)[:, -1].argmax(-1) == key).float().mean().item())
    return out
# --8<-- [end:mechanism]


# %%
if __name__ == "__main__":  # notebook / script: flip a switch above and rerun
    for arm, row in table(0).items():
        print(f"{arm:24s}", row)


# %% [markdown]
# ## Tests
#
# Each test trains the arms it asserts on (one per arm, cached); the last test only reads
# the cache and draws the table and the plot. Every threshold comes from the spread over
# seeds 100-139 (`python -m proofs.seeds proofs/relative/proof_extrapolation_today.py
# --seeds 100-139 --spread`), with a margin of at least four standard deviations; the
# record is `bench/seeds/relative/proof_extrapolation_today.json`.

# %%
import pytest  # noqa: E402


def record_row(ev, arm: str, row, expect: str = "") -> None:
    ev.record(f"{arm}: accuracy at 1x, 2x, 4x the training length", row, expect=expect)
    if row[2] is not None:
        ev.record(f"{arm}: accuracy lost from 1x to 4x", row[0] - row[2], key=False)


# --8<-- [start:test_task]
def test_the_task_needs_order_and_its_answer_is_local(ev, seed):
    """The targets match a brute-force reading of the rule, the latest key is almost always within the last 32
    tokens (so a longer input adds only irrelevant keys), and the order matters: shuffling the prefix changes the
    target. Counters of the task, not results of a model."""
    ids, target = last_key_task(torch.Generator().manual_seed(seed), 16, 4 * TRAIN_LEN)
    brute = torch.full_like(target, IGNORE)
    gaps, rows = [], ids.tolist()  # the loop reads Python ints: indexing the tensor token by token was ~1 s
    for b in range(ids.shape[0]):
        for t in range(ids.shape[1]):
            back = [s for s in range(t, -1, -1) if rows[b][s] <= KEYS]
            if back:
                brute[b, t] = rows[b][back[0]]
                gaps.append(t - back[0])
    ev.record("targets that differ from the brute-force rule", int((brute != target).sum()), expect="0")
    far = sum(g >= TRAIN_LEN for g in gaps) / len(gaps)
    ev.record("fraction of targets whose key is 32 or more tokens back", far, expect="≈ 0 (rate (11/15)^32 ≈ 5e-5)")
    ev.record("mean distance back to the latest key", sum(gaps) / len(gaps), expect="≈ 2.75 (= 11/4)")
    keys = (ids <= KEYS).sum(1)
    order = sum(len(set(ids[b][ids[b] <= KEYS].tolist())) > 1 for b in range(ids.shape[0])) / ids.shape[0]
    ev.record("sequences holding two or more different keys (where order decides)", order, expect="1")
    assert int((brute != target).sum()) == 0 and far < 0.01 and order == 1.0 and int(keys.min()) > 1
# --8<-- [end:test_task]


def test_a_learned_table_has_no_row_past_the_training_length(ev, seed):
    """The learned arm learns the task at 1x, and refuses 2x and 4x: its table has no row 32. That refusal is its
    result in the comparison (a ConfigError of the shared model, exact)."""
    acc = accuracy_by_position("learned", seed)
    ev.record("learned table, input of 128 tokens", acc, expect="ConfigError: no row past max_len")
    row = row_of("learned", seed)
    record_row(ev, "learned", row)
    assert isinstance(acc, str) and "exceeds the learned position table" in acc
    assert row[0] > 0.75  # seeds 100-139: 0.93 ± 0.03 (bench/seeds)


# --8<-- [start:test_rope]
@pytest.mark.claim("C-ROPE-3", "nuanced")
@pytest.mark.claim("C-FOLK-19", "refuted")
def test_rope_loses_accuracy_past_the_training_length(ev, seed):
    """RoPE learns the task at the training length and loses much of it at 2x and 4x, although its scores depend on
    offsets only. Cutting each query's context to its last 32 tokens restores the 1x accuracy: the loss comes from
    keys at offsets never trained. Would be refuted (the folk answer right) if RoPE kept its 1x accuracy at 4x."""
    row = row_of("rope", seed)
    record_row(ev, "RoPE", row, expect="1x ≈ 1, then falling")
    loss = row[0] - row[2]
    ev.record("RoPE: accuracy lost from 1x to 4x", loss, expect="> 0.3")
    window = windowed_accuracy("rope", seed)
    ev.record("RoPE at 4x, each query cut to its last 32 tokens", window, expect="≈ the 1x accuracy")
    # seeds 100-139: 1x 0.999 ± 0.002; loss 0.56 ± 0.03; window − 4x 0.56 ± 0.03 (bench/seeds)
    assert row[0] > 0.95 and loss > 0.3
    assert window > row[2] + 0.3
# --8<-- [end:test_rope]


# --8<-- [start:test_alibi]
@pytest.mark.claim("C-ALIBI-1", "confirmed")
def test_alibi_keeps_its_accuracy_where_rope_loses_it(ev, seed):
    """Flip positions="rope" to "alibi", nothing else: ALiBi keeps its accuracy to 4x the training length, where RoPE
    loses it. Would be refuted if ALiBi's accuracy fell past the training length as RoPE's does. How far back it still
    reaches is the next test."""
    alibi, rope = row_of("alibi", seed), row_of("rope", seed)
    record_row(ev, "ALiBi", alibi, expect="flat")
    ev.record("ALiBi: accuracy lost from 1x to 4x", alibi[0] - alibi[2], expect="≈ 0")
    ev.record("RoPE minus ALiBi: accuracy lost from 1x to 4x", (rope[0] - rope[2]) - (alibi[0] - alibi[2]),
              expect="> 0")
    # seeds 100-139: 1x 0.97 ± 0.01; loss 0.02 ± 0.014; RoPE − ALiBi 0.54 ± 0.03
    assert alibi[0] > 0.85 and alibi[0] - alibi[2] < 0.08
    assert (rope[0] - rope[2]) - (alibi[0] - alibi[2]) > 0.25
# --8<-- [end:test_alibi]


# --8<-- [start:test_lone_key]
LONE_ARMS = {"ALiBi": "alibi", "Shaw (clip 8)": "shaw", "Transformer-XL": "xl", "T5 bias": "t5", "RoPE": "rope"}


def test_a_lone_key_far_back(ev, seed):
    """The lone-key probe on the three arms that hold their accuracy (ALiBi, Shaw, Transformer-XL) and on RoPE and T5,
    the trained models of the table, no training. ALiBi and Shaw find a key 4 back. 96 back, ALiBi mostly misses it
    while Shaw's clipped model, which holds its accuracy just as well, still finds it: holding the accuracy does not by
    itself cost the far key. Transformer-XL, which also holds and has no distance penalty, often misses it too, so the
    toy does not show that ALiBi's penalty, rather than training only on near targets, is what loses it. RoPE and T5
    are recorded, not asserted. Would be refuted (ALiBi reaching as far as another arm that holds) if ALiBi's recall
    96 back came within 0.15 of Shaw's."""
    recall = {arm: lone_key_recall(p, seed) for arm, p in LONE_ARMS.items()}
    for arm, r in recall.items():
        ev.record(f"{arm}: lone key {', '.join(map(str, LONE_KEY))} tokens back, recalled", r,
                  key=arm in ("ALiBi", "Shaw (clip 8)", "Transformer-XL"))
        ev.record(f"{arm}: lone key 96 back", r[3], key=False)
    gap = recall["Shaw (clip 8)"][3] - recall["ALiBi"][3]
    ev.record("Shaw minus ALiBi, lone key 96 back", gap, expect="> 0: a model that holds can still reach it")
    # seeds 100-139 (40/40 passed; bench/seeds): Shaw − ALiBi 96 back 0.64 ± 0.11 (min 0.30, max 0.90), so 0.15 is
    # 4.3 sd below the mean and half the minimum; 96 back, ALiBi 0.32 ± 0.09 (max 0.52), Shaw 0.96 ± 0.08 (min 0.61),
    # Transformer-XL 0.38 ± 0.16 (max 0.84), T5 0.90 ± 0.13, RoPE 0.81 ± 0.18; 4 back, ALiBi and Shaw were above 0.9
    # on every seed (1.0 on each of seeds 100-120 we read), RoPE fell to 0.89 on seed 118, so it is not asserted
    assert min(recall["ALiBi"][0], recall["Shaw (clip 8)"][0]) > 0.9  # the probe works where both were trained
    assert gap > 0.15
# --8<-- [end:test_lone_key]


def test_absolute_sinusoids_fail_past_the_training_length(ev, seed):
    """The 2017 sinusoids learn the task at 1x and fall at 2x and 4x (positions never seen); cut to a 32-token
    window (positions 0..31 again) the same model is accurate. Would be refuted (bounded values extrapolate) if the
    accuracy at 4x stayed within 0.25 of the 1x accuracy."""
    row = row_of("sinusoidal", seed)
    record_row(ev, "sinusoidal", row)
    window = windowed_accuracy("sinusoidal", seed)
    ev.record("sinusoidal at 4x, each query cut to its last 32 tokens", window, expect="≈ the 1x accuracy")
    # seeds 100-139: 1x 0.96 ± 0.02; loss 0.50 ± 0.03; window − 4x 0.39 ± 0.04 (bench/seeds)
    assert row[0] > 0.85 and row[0] - row[2] > 0.25
    assert window > row[2] + 0.2


def test_no_positions_learns_less_and_also_falls(ev, seed):
    """A causal decoder without any position signal orders tokens through the mask alone: it learns the task less
    well in the same steps, and loses accuracy past the training length too. Would be refuted if its accuracy at 4x
    stayed within 0.12 of its 1x accuracy."""
    row = row_of("none", seed)
    record_row(ev, "none (causal mask only)", row)
    assert row[0] - row[2] > 0.12  # seeds 100-139: loss 0.33 ± 0.04 (bench/seeds)


def test_clipped_shaw_holds(ev, seed):
    """Shaw's relative vectors clipped at 8: every offset of 8 or more shares one trained vector, so no offset at 4x
    is new, and the accuracy holds. Would be refuted if it learned the task (1x > 0.9) and lost 0.1 or more at 4x."""
    row = row_of("shaw", seed)
    record_row(ev, "Shaw (clip 8)", row)
    assert row[0] > 0.9 and row[0] - row[2] < 0.1  # seeds 100-139: 1x 0.99 ± 0.006; loss 0.03 ± 0.014


def test_transformer_xl_holds(ev, seed):
    """Transformer-XL's sinusoids of the distance, behind learned projections, hold their accuracy at 4x here.
    Would be refuted if it learned the task (1x > 0.9) and lost 0.1 or more at 4x."""
    row = row_of("xl", seed)
    record_row(ev, "Transformer-XL", row)
    assert row[0] > 0.9 and row[0] - row[2] < 0.1  # seeds 100-139: 1x 0.996 ± 0.004; loss 0.006 ± 0.003


def test_t5_bias_loses_some(ev, seed):
    """T5's bias: every offset of 15 or more shares the last bucket, which was trained, so no offset at 4x is new;
    still the accuracy falls at 4x. Cut to a 32-token window the model recovers much of it (not all): the tokens
    beyond the window cost it. That the far keys, each given the same far-bucket scalar and more numerous at 4x, pile
    up weight is consistent with this (see the ALiBi and T5 page) but not isolated here. Would be refuted if T5 lost
    under 0.05 from 1x to 4x, or if the 32-token window did not recover at least 0.03."""
    t5 = row_of("t5", seed)
    record_row(ev, "T5 bias", t5)
    ev.record("T5: accuracy lost from 1x to 4x", t5[0] - t5[2])
    window = windowed_accuracy("t5", seed)
    ev.record("T5 at 4x, each query cut to its last 32 tokens", window, expect="≈ the 1x accuracy")
    # seeds 100-139: loss 0.29 ± 0.05; window − 4x 0.22 ± 0.04 (bench/seeds)
    assert t5[0] - t5[2] > 0.05
    assert window > t5[2] + 0.03


# --8<-- [start:test_table]
def _plot(ev, curves: dict[str, torch.Tensor], rows: dict[str, list]) -> None:
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 3.8), gridspec_kw={"width_ratios": [3, 2]})
    bins = 4  # positions per point on the left
    for n, (arm, acc) in enumerate(curves.items()):
        if isinstance(acc, str):
            continue
        y = acc.view(-1, bins).nanmean(1)
        left.plot(torch.arange(0, 4 * TRAIN_LEN, bins) + bins / 2, y, label=arm, color=f"C{n}",
                  ls="--" if n % 2 else "-")
    left.axvspan(0, TRAIN_LEN, color="grey", alpha=0.15, label="trained length")
    left.set(xlabel="position in a 128-token test input", ylabel="accuracy", ylim=(0, 1.02),
             title="accuracy by position (means of 4 positions)")
    left.legend(fontsize=7, ncol=2, loc="lower left")
    width = 0.8 / len(FACTORS)
    for k, f in enumerate(FACTORS):
        vals = [r[k] if r[k] is not None else 0.0 for r in rows.values()]
        right.bar([i + k * width for i in range(len(rows))], vals, width, label=f"{f}x")
    right.set_xticks([i + width for i in range(len(rows))], [a.split(" (")[0] for a in rows], rotation=45,
                     ha="right", fontsize=8)
    right.set(ylim=(0, 1.02), title="accuracy at 1x, 2x, 4x (learned: no rows past 1x)")
    right.legend(fontsize=8)
    fig.tight_layout()
    ev.figure(fig, "extrapolation", "Eight position schemes, one model, one task (the most recent key), trained "
                                    "on 32 tokens and tested on 128. Left: accuracy at each position. Right: accuracy "
                                    "on the 32 positions ending at 1x, 2x and 4x the training length.")


@pytest.mark.claim("C-FOLK-19", "refuted")
def test_one_table_eight_schemes(ev, seed):
    """The whole comparison from the cached arms: the schemes whose far offsets are all trained or penalised (Shaw
    clipped, XL, ALiBi) hold their accuracy; the absolute schemes, the mask alone, T5's bucket and RoPE lose it.
    Being relative is not what decides: RoPE and T5 are relative and fall. Would be refuted if every relative
    scheme held its accuracy and only the absolute ones fell."""
    rows = table(seed)
    for arm, row in rows.items():
        ev.record(f"{arm}: accuracy at 1x, 2x, 4x", row)
        for f, v in zip(FACTORS, row):  # one cell each, for the page's table
            ev.record(f"{arm} at {f}x", "no row" if v is None else v, key=False)
    holds = {a: rows[a][0] - rows[a][2] for a in ("Shaw (clip 8)", "Transformer-XL", "ALiBi")}
    falls = {a: rows[a][0] - rows[a][2] for a in ("sinusoidal", "none (causal mask only)", "T5 bias", "RoPE")}
    ev.record("largest loss 1x -> 4x among Shaw, XL, ALiBi", max(holds.values()))
    ev.record("loss 1x -> 4x of RoPE and of T5 (relative schemes that fall)", [falls["RoPE"], falls["T5 bias"]])
    _plot(ev, {arm: accuracy_by_position(p, seed) for arm, p in ARMS.items()}, rows)
    # seeds 100-139: RoPE's loss − the largest hold 0.53 ± 0.03; smallest fall − largest hold 0.26 ± 0.05
    assert falls["RoPE"] > max(holds.values()) + 0.2
    assert min(falls.values()) > max(holds.values())
# --8<-- [end:test_table]
