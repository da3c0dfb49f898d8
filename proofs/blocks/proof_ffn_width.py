# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% [markdown]
# # What does the FFN do, and why 4×d?
#
# Proofs for `docs/blocks/ffn-width.md`. The switch is the existing `cfg.d_ff` (the FFN's hidden width). The task
# and the toy model are in `proofs/ffn_memory.py`: 512 random (subject, relation) -> object facts, a one-layer
# Pre-LN `DecoderLM` (d_model 12, one head, no biases), Adam (lr 0.015) on the full table for 80 steps; "memorised" counts
# facts whose argmax is the object.
#
# 1. The FFN's share of the parameters: an identity of the config (2·r/(4 + 2r) of a layer's matrices at
#    d_ff = r·d), counted from the modules; SwiGLU at 8/3·d keeps it.
# 2. Equal steps: d_ff ∈ {d, 2d, 4d, 8d} at d = 12 on the same facts: facts memorised and loss.
# 3. Equal parameters: d_ff/d from about 1 to about 9 with d_model traded so that the non-embedding parameters
#    match the 4d model's; the facts gained going to ratio 4 against what the added d_ff units alone predict.
# 4. Key–value memory (Geva et al. 2021, §3–4): in the trained 4d model, does each unit's value (its W2 column
#    through the unembedding) promote the objects of the facts that fire its key most? Against the same statistic
#    with keys and values paired at random, and against the untrained model.
# Sections 2-4 train; their thresholds come from seeds 100-139, written beside each assert.
# Run: `pytest proofs/blocks/proof_ffn_width.py`.

# %%
from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from proofs.ffn_memory import (D, R, S, STEPS, V, agreement, agreement_z, ffn_params, matched_d_ff, memory_cfg,
                               non_embedding_params, run, unit_keys_and_values)
from proofs.transformer import DecoderLM, FeedForward, TransformerConfig
from proofs.transformer.config import ConfigError

RATIOS = (1, 2, 4, 8)  # d_ff / d_model at equal steps
EQUAL_PARAM_WIDTHS = (17, 15, D, 9)  # d_model of the equal-parameter arms: d_ff/d about 1, 2, 4, 9


# %% [markdown]
# ## 1. Where the parameters are (an identity)
#
# A layer holds W_Q, W_K, W_V, W_O (4d²) and the FFN's two matrices (2·d·d_ff). At d_ff = r·d the FFN's share of
# the layer's matrices is 2r/(4 + 2r): 1/3 at r = 1, 2/3 at r = 4, 4/5 at r = 8. This is arithmetic about our
# config, not a finding about the world; the count below checks that the modules hold what the formula says.
# SwiGLU has three matrices, so at width 8/3·d it holds 3·d·(8/3)d = 8d², the 4d ReLU FFN's count
# (see docs/blocks/swiglu.md).

# %%
# --8<-- [start:share]
def layer_share(d: int, d_ff: int, **switches) -> dict:
    """Counted from the shared modules (no biases, norms left out): attention and FFN weights of one layer."""
    cfg = TransformerConfig(d_model=d, n_heads=1, d_ff=d_ff, bias=False, **switches)
    model = DecoderLM(cfg.replace(n_layers=1))
    layer = model.decoder.layers[0]
    attn = sum(p.numel() for p in layer.self_attn.parameters())
    ffn = sum(p.numel() for p in layer.ffn.parameters())
    return {"attention": attn, "ffn": ffn, "share": ffn / (attn + ffn)}
# --8<-- [end:share]


@pytest.mark.claim("C-FFN-2", "nuanced")
def test_the_ffn_share_of_parameters_is_an_identity_of_the_config(ev):
    """Identity, not evidence: the FFN's share of a layer's weights is 2r/(4 + 2r) at d_ff = r·d (2/3 at the
    paper's r = 4) and SwiGLU at 8/3·d holds the same 8d² as the ReLU FFN at 4d. Any count off the formula (a bias
    or a matrix we forgot) would fail it."""
    d = 48
    shares = {}
    for r in RATIOS:
        c = layer_share(d, r * d)
        assert c["attention"] == 4 * d * d and c["ffn"] == 2 * r * d * d
        shares[r] = c["share"]
        assert c["share"] == pytest.approx(2 * r / (4 + 2 * r), abs=1e-12)
    ev.record("FFN share of a layer's weights at d_ff = d, 2d, 4d, 8d (d = 48, counted)",
              [round(shares[r], 4) for r in RATIOS], expect="2r/(4 + 2r): 0.3333, 0.5, 0.6667, 0.8")
    relu4 = layer_share(d, 4 * d)["ffn"]
    swiglu = layer_share(d, 8 * d // 3, ffn_gated=True, activation="silu")["ffn"]
    swiglu_4d = layer_share(d, 4 * d, ffn_gated=True, activation="silu")["ffn"]
    ev.record("FFN weights: ReLU at 4d, SwiGLU at 8/3·d, SwiGLU at 4d (d = 48)", [relu4, swiglu, swiglu_4d],
              expect="8d² = 18432, 18432, 12d² = 27648")
    assert relu4 == swiglu == 8 * d * d and swiglu_4d == 12 * d * d
    ev.record("Vaswani et al. 2017 base model (d = 512, d_ff = 2048): FFN share of a layer's weights",
              round(2 * 512 * 2048 / (4 * 512 * 512 + 2 * 512 * 2048), 4), expect="2/3 (arithmetic)")


# %% [markdown]
# ## 2. Equal steps: a wider FFN memorises more
#
# The same 512 facts and the same 80 steps for d_ff = d, 2d, 4d, 8d at d = 12. Widening adds 2·d parameters per
# hidden unit and nothing else. If width did not matter for a memorisation task, the counts would be level.

# %%
# --8<-- [start:equal_steps]
def equal_steps(seed: int) -> dict:
    """Facts memorised, final loss and parameters for d_ff = r·d at d = D, same facts, same steps."""
    return {r: run(seed, D, r * D) for r in RATIOS}
# --8<-- [end:equal_steps]


@pytest.mark.claim("C-FFN-2", "nuanced")
def test_a_wider_ffn_memorises_more_facts_at_equal_steps(ev, seed):
    """At equal steps and d_model, facts memorised (of 512) rise with d_ff from d to 8d and the loss falls. Counts
    level across widths (or falling) would have refuted 'a wider FFN stores more'."""
    res = equal_steps(seed)
    mem = [res[r]["memorised"] for r in RATIOS]
    loss = [res[r]["loss"] for r in RATIOS]
    ev.record(f"facts memorised of {S * R}, d_ff = d, 2d, 4d, 8d (d = {D}, {STEPS} steps)", mem, expect="rising")
    ev.record("final training loss, d_ff = d, 2d, 4d, 8d", [round(x, 3) for x in loss], expect="falling")
    ev.record("FFN parameters, d_ff = d, 2d, 4d, 8d", [res[r]["ffn"] for r in RATIOS], expect="2·d·d_ff")
    ev.record("non-embedding parameters, d_ff = d, 2d, 4d, 8d", [res[r]["non_embedding"] for r in RATIOS])
    gain = mem[-1] - mem[0]
    ev.record("facts memorised: 8d − d", gain, expect="> 50")
    # THRESHOLD: seeds 100-139 (40 seeds): 8d − d = 171.3 ± 31.5 facts, min 104, max 230; 4d > d and loss(8d) < loss(d)
    # on all 40. Bound 50: 3.9 sd below the mean, half the smallest seen.
    assert gain > 50
    assert mem[2] > mem[0] and loss[-1] < loss[0]


# %% [markdown]
# ## 3. Equal parameters: trade d_model for d_ff
#
# Kaplan et al. (2020, §3.1, Fig. 5) hold the non-embedding parameters fixed and vary one shape parameter at a
# time (the d_ff/d_model panel spans about 1 to 10); their summary: within reasonable limits, shape matters little
# next to scale. Here: d_model 17, 15, 12, 9 with
# d_ff chosen so that the non-embedding parameters match the 4d model's (`matched_d_ff`), so d_ff/d is about 1, 1.9,
# 4 and 8.8. The question is whether the d_ff units bought with d_model are worth what the same units were worth
# when added at fixed d_model in section 2 (the opposite hypothesis: only d_ff counts). What is not matched: the
# tied embedding (V·d_model), attention's 4d² and the one head's size all shrink with d_model.

# %%
# --8<-- [start:equal_params]
def equal_params(seed: int) -> dict:
    """The same facts and steps for (d_model, d_ff) pairs with matched non-embedding parameters."""
    target = non_embedding_params(DecoderLM(memory_cfg(D, 4 * D)))
    return {d: run(seed, d, matched_d_ff(d, target)) for d in EQUAL_PARAM_WIDTHS}
# --8<-- [end:equal_params]


@pytest.mark.claim("C-FFN-2", "nuanced")
def test_at_equal_parameters_the_ratio_matters_less_than_width_did(ev, seed):
    """At matched non-embedding parameters, moving d_ff/d from ≈ 1 or 2 up to 4 buys fewer facts than the extra
    hidden units alone would predict. The opposite hypothesis, 'facts stored depend on d_ff itself', predicts the
    gain read off the equal-steps curve of section 2 at the arms' own d_ff (interpolated in log d_ff); had the
    observed gain matched that prediction (shortfall ≈ 0), trading d_model for d_ff would have been as good as
    adding FFN units, and 'at equal parameters the ratio matters little' would have been refuted. The older
    statistic, spread across 1 … 4 over the d → 8d gain, is recorded only: it stays below 1 under that opposite
    hypothesis too (recorded as 'spread / gain if only d_ff mattered'), so it cannot tell the two apart. The ratio-9
    arm (d_model 9) is recorded, not asserted: it memorised fewer facts than ratio 4 on most seeds but not on all."""
    eq = equal_params(seed)
    steps = equal_steps(seed)
    shape = {d: (m["model"].cfg.d_ff, round(m["model"].cfg.d_ff / d, 2)) for d, m in eq.items()}
    mem = {d: eq[d]["memorised"] for d in EQUAL_PARAM_WIDTHS}
    ev.record("(d_model, d_ff, d_ff/d) of the equal-parameter arms",
              [(d, *shape[d]) for d in EQUAL_PARAM_WIDTHS])
    ev.record("non-embedding parameters of the arms", [eq[d]["non_embedding"] for d in EQUAL_PARAM_WIDTHS],
              expect="equal to ±0.2%")
    ev.record("facts memorised, equal parameters, d_ff/d ≈ 1, 2, 4, 9", list(mem.values()))
    ev.record("final training loss, equal parameters, d_ff/d ≈ 1, 2, 4, 9",
              [round(eq[d]["loss"], 3) for d in EQUAL_PARAM_WIDTHS])
    middle = [mem[d] for d in EQUAL_PARAM_WIDTHS[:3]]  # d_ff/d ≈ 1, 2, 4
    spread = max(middle) - min(middle)
    gain = steps[8]["memorised"] - steps[1]["memorised"]
    drop = mem[D] - mem[9]
    ev.record("spread of facts memorised across d_ff/d ≈ 1 … 4 (equal parameters)", spread)
    ev.record("gain from d_ff = d to 8d (equal steps, section 2)", gain)
    ev.record("spread / gain", round(spread / gain, 3), expect="well below 1")
    ev.record("facts lost going from d_ff/d = 4 to ≈ 9 at equal parameters (d_model 12 to 9)", drop,
              expect="> 0 on most seeds (a lean: not asserted)")
    ev.record("embedding parameters of the arms (not matched: V·d_model)", [V * d for d in EQUAL_PARAM_WIDTHS])
    # the opposite hypothesis: facts depend on d_ff alone, read off the equal-steps curve (d_model 12)
    only_dff = lambda d_ff: float(np.interp(np.log2(d_ff), np.log2([r * D for r in RATIOS]),
                                            [steps[r]["memorised"] for r in RATIOS]))
    wide = [only_dff(eq[d]["model"].cfg.d_ff) for d in EQUAL_PARAM_WIDTHS[:3]]
    ev.record("spread / gain if only d_ff mattered (the old statistic under the opposite hypothesis)",
              round((max(wide) - min(wide)) / gain, 3), expect="also below 1: the old test could not fail")
    narrow = EQUAL_PARAM_WIDTHS[:2]  # d_ff/d ≈ 1 and 2
    predicted = [only_dff(eq[D]["model"].cfg.d_ff) - only_dff(eq[d]["model"].cfg.d_ff) for d in narrow]
    observed = [mem[D] - mem[d] for d in narrow]
    shortfall = (sum(predicted) - sum(observed)) / len(narrow)
    ev.record("going to d_ff/d = 4 from ≈ 1, 2 at equal parameters: facts gained if only d_ff mattered",
              [round(x, 1) for x in predicted])
    ev.record("going to d_ff/d = 4 from ≈ 1, 2 at equal parameters: facts gained, observed", observed)
    ev.record("shortfall: predicted − observed gain, mean of the two arms", round(shortfall, 1), expect="> 0")
    figure(ev, steps, eq)
    # THRESHOLD: seeds 100-139 (40 seeds, the same runs in one process): shortfall 74.4 ± 25.5 facts, min 32.9, max
    # 122; bound 0, 2.9 sd below the mean and below the minimum; 0 is what the opposite hypothesis predicts. The old
    # statistic, spread/gain, was 0.32 ± 0.19 (max 0.745) and would be 0.48 ± 0.18 (max 0.83) if only d_ff
    # mattered: below 1 either way, so it is recorded only. The ratio-9 loss, 62.7 ± 36.7 facts (min −16, max 141), was negative on
    # 2 of 40 seeds, so it is recorded, not asserted.
    assert shortfall > 0


def figure(ev, steps: dict, eq: dict) -> None:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    ax.plot([steps[r]["model"].cfg.d_ff / D for r in RATIOS], [steps[r]["memorised"] for r in RATIOS], "o-",
            label=f"equal steps, d_model {D} (parameters grow)")
    ax.plot([eq[d]["model"].cfg.d_ff / d for d in EQUAL_PARAM_WIDTHS],
            [eq[d]["memorised"] for d in EQUAL_PARAM_WIDTHS], "s--", label="equal non-embedding parameters")
    ax.set(xscale="log", xlabel="d_ff / d_model", ylabel=f"facts memorised (of {S * R})",
           title=f"one seed, {STEPS} full-batch steps")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    ev.figure(fig, "width", "Facts memorised against the FFN ratio: at equal steps (d_model fixed, so the FFN and "
                           "the parameter count grow) and at equal non-embedding parameters (d_model traded).")
    plt.close(fig)


# %% [markdown]
# ## 4. Key–value memory: do a unit's triggers and its value agree?
#
# Geva et al. (2021) read FFN(x) = f(x·K)·V as a memory: row i of K (W1) is a key, its activation the memory
# coefficient, row i of V (W2, our `lin2.weight[:, i]`) a value, read as a distribution over the vocabulary by the
# output embedding (§3: keys fire on input patterns; §4: values promote the tokens that follow those patterns).
# On the toy: for each live unit (one that fires on some fact), its top-8 triggering facts, and its value's logits
# over the 32 object tokens (through the final LayerNorm's centring and gain, then the tied unembedding). Score: the mean z-score, within the value's logits, of
# those facts' objects (0 by chance), and Geva's agreement rate (the value's top token is the object of one of the
# triggers). Controls: the same statistics with each key paired with a random other unit's value (50
# permutations), and the untrained model.

# %%
# --8<-- [start:key_value]
def key_value(model: DecoderLM, x: torch.Tensor, objects: torch.Tensor, seed: int, perms: int = 50) -> dict:
    keys, values = unit_keys_and_values(model, x)  # (facts, d_ff), (d_ff, V)
    g = torch.Generator().manual_seed(seed)
    shuffles = [torch.randperm(keys.shape[1], generator=g) for _ in range(perms)]
    return {"z": agreement_z(keys, values, objects),
            "z shuffled": sum(agreement_z(keys, values, objects, perm=p) for p in shuffles) / perms,
            "hit": agreement(keys, values, objects),
            "hit shuffled": sum(agreement(keys, values, objects, perm=p) for p in shuffles) / perms}
# --8<-- [end:key_value]


@pytest.mark.claim("C-FFN-2", "nuanced")
def test_ffn_units_act_as_key_value_memories_on_the_toy(ev, seed):
    """In the trained 4d model, a unit's value promotes the objects of the facts that fire its key most: the mean
    z-score is above the shuffled-pairing control and the untrained model. Scores at the controls' level would have
    refuted the key–value reading on this task."""
    r = run(seed, D, 4 * D)
    objects = r["y"][:, -1]
    trained = key_value(r["model"], r["x"], objects, seed)
    torch.manual_seed(seed)
    untrained = key_value(DecoderLM(memory_cfg(D, 4 * D)), r["x"], objects, seed)
    for k, v in trained.items():
        ev.record(f"trained: {k}", round(v, 3))
    ev.record("untrained: z", round(untrained["z"], 3), expect="≈ 0")
    ev.record("chance agreement rate (top-8 facts, 32 objects): 1 − (31/32)^8", round(1 - (31 / 32) ** 8, 3))
    ev.record("z − z shuffled", round(trained["z"] - trained["z shuffled"], 3), expect="> 0.08")
    ev.record("z − untrained z", round(trained["z"] - untrained["z"], 3), expect="> 0.05")
    ablated = copy.deepcopy(r["model"])  # the same trained model with every FFN value zeroed (W2 = 0)
    with torch.no_grad():
        ablated.decoder.layers[0].ffn.lin2.weight.zero_()
        kept = int((ablated(r["x"])[:, -1].argmax(-1) == objects).sum())
    ev.record(f"facts memorised of {S * R}: trained 4d model, and with its FFN output zeroed", [r["memorised"], kept],
              expect=f"zeroed far below (chance {S * R // S})")
    # THRESHOLD: seeds 100-139 (40 seeds): trained z 0.312 ± 0.067 (min 0.190), shuffled 0.009 ± 0.016 (max 0.068),
    # untrained −0.001 ± 0.047 (max 0.083); the differences themselves: z − shuffled 0.303 ± 0.066 (min 0.181),
    # z − untrained 0.312 ± 0.083 (min 0.142). Bounds 0.08 and 0.05: 3.4 and 3.2 sd below those means, and below
    # each minimum. FFN zeroed: 40.8 ± 7.8 facts (max 58) against about 280 with it; bound half the trained count.
    assert trained["z"] - trained["z shuffled"] > 0.08
    assert trained["z"] - untrained["z"] > 0.05
    assert kept < r["memorised"] / 2


# %% [markdown]
# ## 5. Bad settings

# %%
def test_bad_settings_raise_config_error(ev):
    """d_ff = 0 and a top-k larger than the fact table each raise ConfigError naming the fix."""
    with pytest.raises(ConfigError, match="d_ff") as err:
        memory_cfg(D, 0)
    ev.record("memory_cfg(d_ff=0)", str(err.value), key=False)
    keys, values = torch.rand(4, 3), torch.rand(3, 1 + S + R)
    with pytest.raises(ConfigError, match="top_k") as err:
        agreement_z(keys, values, torch.ones(4, dtype=torch.long), top_k=8)
    ev.record("agreement_z with top_k 8 > 4 facts", str(err.value), key=False)
