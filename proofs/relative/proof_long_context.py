# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% [markdown]
# # How do long-context models stretch RoPE?
#
# Proofs for the page `docs/relative/long-context.md`. Three ways to run a RoPE model past
# its training length L at a target length L' = s·L, each a value of `rope_scaling` in the
# shared module (`positions.rope_inv_freq`):
#
# - "linear", position interpolation (Chen et al. 2023): position m is used as m/s, so every
#   angle stays inside the trained range;
# - "ntk", NTK-aware scaling (bloc97, 2023): the base b becomes b·s^(d/(d−2)): the fastest
#   pair keeps its frequency, the slowest is divided by s;
# - "yarn" (Peng et al. 2023): per pair, by the number of turns r it makes over L: pairs
#   with r > β = 32 keep their frequency, pairs with r < α = 1 are interpolated like PI, a
#   linear ramp in between; and q, k are scaled by 0.1·ln s + 1 (the attention temperature).
#
# The model is the RoPE arm of the extrapolation page (`proof_extrapolation_today.py`),
# trained on 32 tokens; the target is s = 4, 128 tokens. Run it with
# `pytest proofs/relative/proof_long_context.py`.

# %%
from __future__ import annotations

import math
from functools import cache

import torch

from proofs.length_runs import (
    FACTORS,
    IGNORE,
    TRAIN_LEN,
    eval_batch,
    last_key_task,
    trained,
)
from proofs.train import train
from proofs.transformer import DecoderLM, rope_inv_freq
from proofs.transformer.positions import rope_attention_factor

S = 4  # target length / training length
METHODS = {"RoPE as trained": "none", "position interpolation": "linear", "NTK-aware": "ntk", "YaRN": "yarn"}
FT_STEPS, FT_BATCH, FT_LR = 15, 8, 3e-3  # the short fine-tune, at the target length 128


# %% [markdown]
# ## 1. What each method does to the angles
#
# Pair i turns by m·θ_i at position m. Over the training length it reaches at most L·θ_i;
# at the target length L' the scaled frequency θ'_i reaches L'·θ'_i. Their ratio says
# whether the target length asks for angles the model never saw: a ratio above 1 in a pair
# that did not complete a full turn in training (L·θ_i < 2π) is an angle out of the
# trained range. Computed for a LLaMA-sized head (d = 128, L = 2048) and for our toy head
# (d = 8, L = 32), s = 4. These are counts of formulas, exact by construction.

# %%
# --8<-- [start:angles]
def angle_ratios(d: int, L: int, s: float = S, base: float = 10000.0) -> dict[str, torch.Tensor]:
    """Per pair: largest angle at L' = s·L with the scaled frequencies / largest angle over L unscaled."""
    theta = rope_inv_freq(d, base)
    return {name: s * L * rope_inv_freq(d, base, scaling, s, L) / (L * theta) for name, scaling in METHODS.items()}


def out_of_range_pairs(d: int, L: int, s: float = S) -> dict[str, int]:
    """Pairs that meet angles never seen in training: below one full turn over L, and a ratio above 1."""
    partial = L * rope_inv_freq(d) < 2 * math.pi  # pairs that never completed a turn in training
    return {name: int(((r > 1 + 1e-9) & partial).sum()) for name, r in angle_ratios(d, L, s).items()}
# --8<-- [end:angles]


# %% [markdown]
# ## 2. Without training, and after a short fine-tune at the target length
#
# Each method is applied to the trained weights (the frequencies are a non-persistent
# buffer set by the config, so `load_state_dict` carries every weight over unchanged).
# Accuracy is measured as on the extrapolation page: on the 32 positions that end at 1x, 2x
# and 4x the training length. Then each model (and the unscaled one: "direct fine-tuning",
# the baseline of Chen et al.) is fine-tuned for 15 Adam steps of 8 sequences of 128 tokens,
# the same batches for all, learning rate 0.003, and measured again.

# %%
# --8<-- [start:stretch]
def with_scaling(method: str, seed: int) -> DecoderLM:
    source = trained("rope", seed)
    scaled = DecoderLM(source.cfg.replace(rope_scaling=method, rope_factor=float(S) if method != "none" else 1.0,
                                          rope_train_len=TRAIN_LEN))
    scaled.load_state_dict(source.state_dict())
    return scaled.eval()


def blocks(model: DecoderLM, seed: int) -> list[float]:
    """Accuracy on the 32 positions ending at 1x, 2x, 4x the training length."""
    ids, target = eval_batch(seed)
    with torch.no_grad():
        hit = (model(ids).argmax(-1) == target) & (target != IGNORE)
    valid = target != IGNORE
    return [(hit[:, (f - 1) * TRAIN_LEN: f * TRAIN_LEN].sum() / valid[:, (f - 1) * TRAIN_LEN: f * TRAIN_LEN].sum()
             ).item() for f in FACTORS]


@cache
def fine_tuned(method: str, seed: int, steps: int = FT_STEPS) -> DecoderLM:
    """The scaled model after `steps` Adam steps at the target length (the same batches for every method)."""
    model = with_scaling(method, seed)
    g = torch.Generator().manual_seed(2000 + seed)
    data = [last_key_task(g, FT_BATCH, S * TRAIN_LEN) for _ in range(steps)]
    train(model, lambda step: data[step], steps, lr=FT_LR)
    return model
# --8<-- [end:stretch]


def built_frequencies(seed: int) -> dict:
    """What each scaled model holds: every layer's rotary frequencies and gain against rope_inv_freq(…, TRAIN_LEN) and
    rope_attention_factor (exact equality), and YaRN built with max_len apart from rope_train_len (the ramp must follow
    rope_train_len); the control is YaRN's frequencies for a training length of 64, the config's default."""
    out = {}
    for name, method in METHODS.items():
        model, factor = with_scaling(method, seed), float(S) if method != "none" else 1.0
        cfg = model.cfg
        want = rope_inv_freq(cfg.d_head, cfg.rope_base, method, factor, TRAIN_LEN)
        out[name] = all(torch.equal(layer.self_attn.inv_freq, want)
                        and layer.self_attn.rope_gain == rope_attention_factor(method, factor)
                        for layer in model.decoder.layers)
    cfg = with_scaling("yarn", seed).cfg.replace(max_len=S * TRAIN_LEN)  # YaRN, max_len no longer equal to TRAIN_LEN
    wide = DecoderLM(cfg)
    yarn = rope_inv_freq(cfg.d_head, cfg.rope_base, "yarn", float(S), TRAIN_LEN)
    out["YaRN, max_len = 4 × TRAIN_LEN"] = all(torch.equal(layer.self_attn.inv_freq, yarn) for layer in wide.decoder.layers)
    out["YaRN fastest pair: at TRAIN_LEN, at the default 64"] = [
        yarn[0].item(), rope_inv_freq(cfg.d_head, cfg.rope_base, "yarn", float(S), 64)[0].item()]
    return out


# %%
if __name__ == "__main__":
    print(out_of_range_pairs(128, 2048), out_of_range_pairs(8, 32))
    for name, method in METHODS.items():
        print(name, blocks(with_scaling(method, 0), 0), blocks(fine_tuned(method, 0), 0))


# %% [markdown]
# ## Tests
#
# Thresholds come from the spread over seeds 100-139, recorded in
# `bench/seeds/relative/proof_long_context.json`.

# %%
import pytest  # noqa: E402


def _plot(ev) -> None:
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 3.6))
    for ax, (d, L, title) in zip(axes, ((128, 2048, "LLaMA-sized head: d = 128, L = 2048"),
                                        (8, 32, "our toy head: d = 8, L = 32"))):
        pairs = torch.arange(d // 2)
        turns = L * rope_inv_freq(d) / (2 * math.pi)
        for n, (name, r) in enumerate(angle_ratios(d, L).items()):
            ax.plot(pairs, r, "o-" if d == 8 else "-", label=name, color=f"C{n}", ms=4)
        full = pairs[turns >= 1]
        if len(full):
            ax.axvspan(-0.5, full[-1] + 0.5, color="grey", alpha=0.15, label="pairs with ≥ 1 turn over L")
        ax.axhline(1, color="k", lw=0.8, ls=":")
        ax.set(xlabel="pair i (frequency θ_i falls from left to right)", yscale="log",
               ylabel="largest angle at 4L / largest angle over L", title=title)
        ax.legend(fontsize=7)
    fig.tight_layout()
    ev.figure(fig, "angles", "For each rotated pair: the largest angle reached at the target length 4L with each "
                             "method, divided by the largest angle reached in training. Above the dotted line, outside "
                             "the grey band, a pair meets angles it never saw.")


# --8<-- [start:test_angles]
def test_which_angles_each_method_leaves_untrained(ev, seed):
    """Counted from the formulas (exact): unscaled RoPE at 4L asks every pair that never completed a turn for new
    angles; position interpolation and YaRN ask none; NTK-aware scaling still asks some middle pairs (the
    "out-of-bound" dimensions of Peng et al. §3.1). PI slows the fastest pair by s, NTK and YaRN keep it."""
    big, toy = out_of_range_pairs(128, 2048), out_of_range_pairs(8, 32)
    ev.record("pairs with untrained angles at 4L, d = 128, L = 2048 (of 64)", big)
    ev.record("pairs with untrained angles at 4L, toy d = 8, L = 32 (of 4)", toy)
    fastest = {name: (rope_inv_freq(128, 10000.0, m, S, 2048)[0] / rope_inv_freq(128)[0]).item()
               for name, m in METHODS.items()}
    ev.record("fastest pair's frequency after scaling / before, d = 128", fastest, expect="PI 1/4; NTK, YaRN 1")
    kept = int((rope_inv_freq(128, 10000.0, "yarn", S, 2048) == rope_inv_freq(128)).sum())
    ev.record("pairs YaRN leaves unchanged, d = 128, L = 2048 (of 64)", kept, expect="those with more than 32 turns")
    _plot(ev)
    for counts in (big, toy):
        assert counts["position interpolation"] == 0 and counts["YaRN"] == 0
        assert counts["RoPE as trained"] > counts["NTK-aware"] > 0
    assert fastest["position interpolation"] == pytest.approx(1 / S) and fastest["NTK-aware"] == 1.0
    assert fastest["YaRN"] == 1.0
# --8<-- [end:test_angles]


# --8<-- [start:test_no_ft]
@pytest.mark.claim("C-ROPE-3", "nuanced")
def test_without_training_interpolation_stretches_the_model(ev, seed):
    """Applied to the trained weights with no training at all: unscaled RoPE falls at 4x; position interpolation and
    YaRN keep most of their accuracy to 4x but pay some of it at 1x (consistent with the squeezed local offsets);
    NTK-aware scaling keeps 1x and 2x and falls at 4x, consistent with the pairs test 1 counts as out of range. This
    order is the toy's (head size 8, s equal to the target ratio), the reverse of what Peng et al. (§3.1) report for
    LLaMA without fine-tuning, where NTK-aware beats PI. Would be refuted if unscaled RoPE held at 4x (no stretch
    needed) or if no method held there. Each arm is checked to hold, in every layer, exactly the frequencies and gain
    of its formula at the training length (YaRN's ramp follows rope_train_len, not the default or max_len)."""
    rows = {name: blocks(with_scaling(m, seed), seed) for name, m in METHODS.items()}
    for name, row in rows.items():
        ev.record(f"no fine-tune, {name}: accuracy at 1x, 2x, 4x", row)
        for f, v in zip(FACTORS, row):  # one cell each, for the page's table
            ev.record(f"no fine-tune, {name} at {f}x", v, key=False)
    plain, pi, ntk, yarn = (rows[n] for n in METHODS)
    # thresholds from the spread over seeds 100-139 (bench/seeds)
    # the arms are what they say: every layer's frequencies and gain equal the formula at TRAIN_LEN, exactly
    freqs = built_frequencies(seed)
    for name in METHODS:
        ev.record(f"every layer's θ_i and gain equal rope_inv_freq(…, TRAIN_LEN), {name}", freqs[name], key=False)
    ev.record("YaRN's fastest pair: built at TRAIN_LEN, and what a training length of 64 would give",
              freqs["YaRN fastest pair: at TRAIN_LEN, at the default 64"], key=False)
    assert all(freqs[name] for name in METHODS) and freqs["YaRN, max_len = 4 × TRAIN_LEN"]
    fast, default = freqs["YaRN fastest pair: at TRAIN_LEN, at the default 64"]
    assert abs(fast - default) > 0.1  # control: the check above can tell the two training lengths apart
    assert pi[2] > plain[2] + 0.2 and yarn[2] > plain[2] + 0.2
    assert ntk[1] > plain[1] and ntk[2] < pi[2]
# --8<-- [end:test_no_ft]


# --8<-- [start:test_ft]
@pytest.mark.claim("C-ROPE-3", "nuanced")
def test_a_short_fine_tune_with_interpolation_reaches_4x(ev, seed):
    """15 steps at the target length: with position interpolation or YaRN the model is accurate at 1x, 2x and 4x.
    Would be refuted if the interpolated models stayed inaccurate at 4x after the fine-tune."""
    rows = {name: blocks(fine_tuned(m, seed), seed) for name, m in (("position interpolation", "linear"),
                                                                     ("YaRN", "yarn"))}
    for name, row in rows.items():
        ev.record(f"after 15 steps at 128 tokens, {name}: accuracy at 1x, 2x, 4x", row)
        for f, v in zip(FACTORS, row):
            ev.record(f"fine-tuned, {name} at {f}x", v, key=False)
    assert min(min(row) for row in rows.values()) > 0.9  # seeds 100-139: see bench/seeds


@pytest.mark.claim("C-ROPE-3", "nuanced")
def test_direct_fine_tuning_lags_behind(ev, seed):
    """The same 15 steps at 128 tokens without any scaling ("direct fine-tuning", the baseline of Chen et al.) leave
    the model below the interpolated one at 4x (mean over two trained models: how well the unscaled model recovers
    varies a lot from one trained model to the next). The margin is short of the project's 4 sd: over seeds 100-139
    the two-model mean is 3.7 sd above the threshold 0 (its smallest value 0.16); a third trained model would add
    about 5 CPU-s to the run, so the test keeps two and says so here. Would be refuted if direct fine-tuning caught
    up in the same steps (a mean gap of 0 or less)."""
    gaps = []
    for s in (seed, seed + 1):
        direct, pi = blocks(fine_tuned("none", s), s), blocks(fine_tuned("linear", s), s)
        gaps.append(pi[2] - direct[2])
        if s == seed:
            for f, v in zip(FACTORS, direct):
                ev.record(f"fine-tuned, RoPE as trained at {f}x", v, key=False)
            ev.record("after 15 steps at 128 tokens, RoPE unscaled: accuracy at 1x, 2x, 4x", direct)
    ev.record(f"position interpolation minus unscaled at 4x after 15 steps, seeds {[seed, seed + 1]}", gaps)
    ev.record("mean of the two gaps", sum(gaps) / len(gaps))
    # over seeds 100-139 one model's gap was 0.32 ± 0.11 (min 0.12) and the two-model mean 0.32 ± 0.087 (min 0.16):
    # the threshold 0 is 3.7 sd below the mean, short of the 4 sd margin; averaging over the fine-tune batches of
    # one trained model did not reduce the spread (it comes from the trained model), and three trained models
    # would cost about 5 CPU-s
    assert sum(gaps) / len(gaps) > 0.0
# --8<-- [end:test_ft]


def test_ntk_after_the_same_fine_tune(ev, seed):
    """NTK-aware scaling fine-tuned the same way, for the table. Peng et al. (§3.1) report that fine-tuning with it
    does worse than with PI, because some of its pairs are extrapolated. Only its 1x accuracy is asserted (it must
    not break the trained length: refuted if it fell to 0.8 or below); the PI − NTK gap at 4x is recorded, not asserted."""
    row = blocks(fine_tuned("ntk", seed), seed)
    ev.record("after 15 steps at 128 tokens, NTK-aware: accuracy at 1x, 2x, 4x", row)
    for f, v in zip(FACTORS, row):
        ev.record(f"fine-tuned, NTK-aware at {f}x", v, key=False)
    pi = blocks(fine_tuned("linear", seed), seed)
    ev.record("position interpolation minus NTK-aware at 4x, after the fine-tune", pi[2] - row[2])
    assert row[0] > 0.8  # seeds 100-139: see bench/seeds
