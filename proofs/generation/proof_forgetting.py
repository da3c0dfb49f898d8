# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% [markdown]
# # Catastrophic forgetting: what is it, and what prevents it?
#
# Proofs for `docs/generation/forgetting.md`. A one-layer `DecoderLM` (d_model 32) learns task A, a lookup map on
# the lower half of a 32-token vocabulary (`proofs/forgetting_tasks.py`), then task B, the same kind of map on the
# upper half: no input token is shared. One pre-trained A model per seed is copied into every arm, and every arm
# gets the same 60 B batches at Adam's rate 1e-2 unless the arm is the rate: full fine-tuning, LoRA at r = 1, 4,
# 16 (every linear layer of the block, α = 2r), full fine-tuning with 10 % of each batch replayed from A, full
# fine-tuning at a 10× lower rate, an L2 pull towards the A weights (EWC with equal weights), and training the FFN
# only. Measured: A accuracy before and after, B accuracy reached. Thresholds come from seeds 100-139 and are
# written beside each assert. Run: `pytest proofs/generation/proof_forgetting.py`.

# %%
from __future__ import annotations

import copy
import functools

import pytest
import torch

from proofs.forgetting_tasks import halves, l2_to_old, task_a, task_b, with_replay
from proofs.tasks import lookup_table
from proofs.train import fixed_batches, train
from proofs.transformer import DecoderLM, LoRALinear, TransformerConfig, apply_lora, merge_lora, trainable_parameters
from proofs.transformer.config import ConfigError

# %% [markdown]
# ## The set-up: task A, then task B, every arm from the same A model

# %%
# --8<-- [start:setup]
V, T, BATCH = 32, 8, 20                  # 15 input tokens per task; 20 sequences of 8 tokens per step
PRE_STEPS, B_STEPS = 100, 60             # learn A, then B
LR, LOW_LR = 1e-2, 1e-3                  # Adam; every arm at LR except the lower-rate arm
RANKS = (1, 4, 16)
TARGETS = ("w_q", "w_k", "w_v", "w_o", "lin1", "lin2")  # LoRA on every linear layer of the block
REPLAY, L2 = 0.1, 0.1                    # 2 of 20 rows from A; strength of the pull towards the A weights
CFG = TransformerConfig(vocab_size=V, d_model=32, n_heads=2, n_layers=1, d_ff=64, norm_position="pre",
                        positions="learned", max_len=T, dropout_emb=0.0, dropout_residual=0.0)


@functools.lru_cache(maxsize=None)
def model_after_a(seed: int) -> DecoderLM:
    """The shared starting point: a fresh model trained on task A only (cached; every arm deep-copies it)."""
    torch.manual_seed(seed)
    model = DecoderLM(CFG)
    train(model, fixed_batches(task_a, 100 + seed, BATCH, T, V), PRE_STEPS, lr=LR)
    return model.eval()


def accuracy(model, task, seed: int) -> float:
    """Share of 2,048 fresh tokens of `task` whose answer is the model's argmax."""
    x, y = task(torch.Generator().manual_seed(9_000 + seed), 256, T, V)
    with torch.no_grad():
        return (model.eval()(x).argmax(-1) == y).float().mean().item()


@functools.lru_cache(maxsize=None)
def fine_tune_on_b(seed: int, arm: str) -> DecoderLM:
    """A copy of the A model trained on B's 60 batches (the same batches for every arm) the way `arm` says
    (cached: tests read it, never train it further)."""
    model, task, lr, extra = copy.deepcopy(model_after_a(seed)), task_b, LR, None
    if arm.startswith("LoRA"):
        r = int(arm.split("=")[1])
        torch.manual_seed(10_000 + seed)  # A's random init: the same whichever tests ran before
        apply_lora(model, TARGETS, r=r, alpha=2.0 * r)
    elif arm == "replay 10 %":
        task = with_replay(task_b, task_a, REPLAY, BATCH)
    elif arm == "full, lr / 10":
        lr = LOW_LR
    elif arm == "L2 to the A weights":
        extra = l2_to_old(model, L2)
    elif arm == "FFN only":
        for name, p in model.named_parameters():
            p.requires_grad_(".ffn." in name)
    else:
        assert arm == "full fine-tuning", arm
    train(model, fixed_batches(task, 200 + seed, BATCH, T, V), B_STEPS, lr=lr, extra_loss=extra)
    return model.eval()


ARMS = ("full fine-tuning", *(f"LoRA r={r}" for r in RANKS), "replay 10 %", "full, lr / 10",
        "L2 to the A weights", "FFN only")


@functools.lru_cache(maxsize=None)
def results(seed: int) -> dict:
    """Per arm: A accuracy after B, B accuracy reached, trainable parameters; plus the A model's own scores."""
    before = model_after_a(seed)
    out = {"before": {"A": accuracy(before, task_a, seed), "B": accuracy(before, task_b, seed)}}
    for arm in ARMS:
        m = fine_tune_on_b(seed, arm)
        out[arm] = {"A": accuracy(m, task_a, seed), "B": accuracy(m, task_b, seed), "n": trainable_parameters(m)}
    return out
# --8<-- [end:setup]


def answers_from_b(model, seed: int) -> float:
    """On A's inputs, the share of the model's answers that are one of B's answer tokens."""
    x, _ = task_a(torch.Generator().manual_seed(9_000 + seed), 256, T, V)
    b_answers = lookup_table(V)[torch.tensor(list(halves(V)[1])) - 1]
    with torch.no_grad():
        return torch.isin(model.eval()(x).argmax(-1), b_answers).float().mean().item()


# %% [markdown]
# ## 1. Full fine-tuning on B erases A; replaying 10 % of A keeps it

# %%
# --8<-- [start:test_forget]
@pytest.mark.claim("C-FORGET-1", "nuanced")
def test_fine_tuning_on_b_erases_a_and_replay_keeps_it(ev, seed):
    """Full fine-tuning on task B (disjoint inputs) at the rate that learnt A: A accuracy falls from about 1 to
    near 0 while B is learnt; the same run with 2 of every 20 sequences drawn from A keeps A and learns B as well.
    Also recorded: on A's inputs the forgetting model mostly answers with B's answer tokens, i.e. the old inputs
    are not left unanswered but answered as if they were new. Would refute 'fine-tuning causes catastrophic
    forgetting' here if A stayed high after plain fine-tuning; would refute 'replay prevents it' if the replay
    arm lost A as well, or kept A by not learning B."""
    res = results(seed)
    full, replay = res["full fine-tuning"], res["replay 10 %"]
    share_b = answers_from_b(fine_tune_on_b(seed, "full fine-tuning"), seed)
    ev.record("A accuracy of the A model / its B accuracy (before B)", [res["before"]["A"], res["before"]["B"]],
              expect="≈ 1 / ≈ 0")
    ev.record("full fine-tuning: A after B, B reached", [full["A"], full["B"]])
    ev.record("replay 10 %: A after B, B reached", [replay["A"], replay["B"]])
    ev.record("A kept, replay − full fine-tuning", replay["A"] - full["A"], expect="> 0.6 (asserted)")
    ev.record("full fine-tuning: share of answers on A's inputs that are B answer tokens", share_b)
    # Over seeds 100-139 (mean ± sd, min): A before 1.000 on all 40; replay's A after and B reached 1.000 on all 40;
    # A kept, replay − full 0.969 ± 0.043 (min 0.851): the bound 0.6 is 8.5 sd below the mean; full fine-tuning's
    # A after B is at most 0.149, so A before − after exceeds 0.85 on every seed (bound 0.5).
    assert res["before"]["A"] > 0.95
    assert full["B"] > 0.9 and replay["B"] > 0.9
    assert res["before"]["A"] - full["A"] > 0.5
    assert replay["A"] - full["A"] > 0.6
# --8<-- [end:test_forget]


# %% [markdown]
# ## 2. LoRA forgets less and learns less; a higher rank forgets like full fine-tuning

# %%
# --8<-- [start:test_lora]
@pytest.mark.claim("C-FORGET-1", "nuanced")
def test_lora_forgets_less_learns_less(ev, seed):
    """Same B batches, same rate. LoRA at r = 1 learns far less of B than full fine-tuning (asserted on every
    seed) and keeps more of A on average over seeds, but not on every seed (recorded, not asserted: the spread
    is in the comment); at r = 16 it learns B and forgets A like full fine-tuning. Full fine-tuning at a ten
    times lower rate keeps more A *and* learns more B than LoRA r = 1 (asserted): on this toy LoRA's smaller
    forgetting is bought with less learning, not a better trade-off. Would refute 'LoRA learns less' if r = 1
    came within 0.3 of full fine-tuning's B accuracy; would refute 'a lower rate gives a better trade-off than
    LoRA r = 1 here' if that arm kept less A or learnt less B than r = 1."""
    res = results(seed)
    full, r1, r16, low = res["full fine-tuning"], res["LoRA r=1"], res["LoRA r=16"], res["full, lr / 10"]
    for arm in ARMS:
        ev.record(f"{arm}: A after B", res[arm]["A"])
        ev.record(f"{arm}: B reached", res[arm]["B"])
        ev.record(f"{arm}: trainable parameters", res[arm]["n"], key=False)
    ev.record("A kept, LoRA r=1 − full fine-tuning", r1["A"] - full["A"], expect="> 0 on average, not every seed")
    ev.record("B reached, full fine-tuning − LoRA r=1", full["B"] - r1["B"], expect="> 0.3 (asserted)")
    ev.record("A kept, LoRA r=1 − LoRA r=16", r1["A"] - r16["A"], expect="> 0 on average, not every seed")
    ev.record("A lost, LoRA r=16", res["before"]["A"] - r16["A"], expect="> 0.5 (asserted)")
    ev.record("A kept, full at lr / 10 − LoRA r=1", low["A"] - r1["A"], expect="> 0.2 (asserted)")
    ev.record("B reached, full at lr / 10 − LoRA r=1", low["B"] - r1["B"], expect="> 0 (asserted)")
    _plot(ev, res)
    # Over seeds 100-139 (mean ± sd, min, max). Not asserted: A kept, r=1 − full 0.149 ± 0.123 (min -0.064, max
    # 0.40), r=1 − r=16 0.150 ± 0.128 (min -0.053): LoRA r=1 forgets less on average (40 seeds: 7.6 standard
    # errors above 0) but a single seed can go either way, so no per-seed bound would have the margin we require.
    # Asserted: full − r=1 in B reached 0.765 ± 0.081 (min 0.54): the bound 0.3 is 5.7 sd below the mean. Full at
    # lr / 10 against r=1: its A kept is at least 0.836 on every seed and r=1's at most 0.538, so the A difference
    # is above 0.29 on every seed (bound 0.2); its B reached is at least 0.494, r=1's at most 0.460 (B difference
    # above 0.03 on every seed, typically about 0.5: the thinnest bound here, see the seed record).
    assert full["B"] - r1["B"] > 0.3
    assert res["before"]["A"] - r16["A"] > 0.5 and r16["B"] > 0.8
    assert low["A"] - r1["A"] > 0.2 and low["B"] - r1["B"] > 0.0
# --8<-- [end:test_lora]


def _plot(ev, res):
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for i, arm in enumerate(ARMS):
        ax.scatter(res[arm]["B"], res[arm]["A"], s=60, color=f"C{i}", marker="o" if "LoRA" not in arm else "s",
                   label=arm, zorder=3)
    ax.scatter(res["before"]["B"], res["before"]["A"], s=80, color="black", marker="*", label="before B", zorder=3)
    ax.set(xlim=(-0.05, 1.05), ylim=(-0.05, 1.05), xlabel="task B accuracy reached (learnt)",
           ylabel="task A accuracy after B (kept)", title="learn vs forget, one seed, 60 B steps")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="lower left")
    fig.tight_layout()
    ev.figure(fig, "tradeoff", "Each arm after 60 steps on task B from the same A model: top right is learning B "
                               "and keeping A. Squares: LoRA (r = 1, 4, 16, frozen base).")


# %% [markdown]
# ## 3. "LoRA cannot forget: the base weights are frozen"

# %%
# --8<-- [start:test_folk]
@pytest.mark.claim("C-FOLK-33", "refuted")
def test_frozen_base_lora_still_forgets(ev, seed):
    """After LoRA (r = 1, the least-forgetting rank) on task B, every frozen base weight is bit-for-bit the A
    model's, yet the merged W₀ + (α/r)·B A gives different logits on A's inputs and A accuracy falls. Removing the
    adapter (using W₀ alone) restores the A model exactly: the base is recoverable, the adapted model has
    forgotten. Would confirm the folk answer if A accuracy after LoRA stayed at its value before (within the
    seed spread) or the logits on A's inputs did not move."""
    before = model_after_a(seed)
    lora = fine_tune_on_b(seed, "LoRA r=1")
    old = dict(before.named_parameters())
    frozen_same = all(torch.equal(p, old[n.replace(".base.", ".")])  # every non-adapter parameter, W₀ included
                      for n, p in lora.named_parameters() if n.rsplit(".", 1)[-1] not in ("A", "B"))
    merged = merge_lora(copy.deepcopy(lora))
    removed = copy.deepcopy(lora)
    for m in removed.modules():
        if isinstance(m, LoRALinear):
            m.B.data.zero_()
    x, _ = task_a(torch.Generator().manual_seed(9_000 + seed), 256, T, V)
    with torch.no_grad():
        gap_merged = (merged(x) - before(x)).abs().max().item()
        gap_removed = (removed.eval()(x) - before(x)).abs().max().item()
    a_before, a_after = accuracy(before, task_a, seed), accuracy(merged, task_a, seed)
    ev.record("every frozen weight bit-for-bit the A model's", frozen_same, expect="True")
    ev.record("max |logit − A model| on A's inputs, merged W₀ + BA", gap_merged, expect="> 0")
    ev.record("max |logit − A model| on A's inputs, adapter removed", gap_removed, expect="0")
    ev.record("A accuracy before / after LoRA r=1 on B", [a_before, a_after])
    ev.record("A accuracy lost by LoRA r=1", a_before - a_after, expect="> 0.2 (asserted)")
    ev.record("B accuracy reached by LoRA r=1", accuracy(merged, task_b, seed), key=False)
    # Over seeds 100-139: frozen weights identical and removed-adapter gap 0 on all 40; merged gap 14.7 ± 1.2
    # (min 12.5); A accuracy lost by LoRA r=1 0.820 ± 0.125 (min 0.462): the bound 0.2 is 5.0 sd below the mean.
    assert frozen_same
    assert gap_removed == 0.0 < gap_merged
    assert a_before - a_after > 0.2
# --8<-- [end:test_folk]


# %% [markdown]
# ## 4. The follow-ups: a lower rate, a pull towards the old weights, freezing

# %%
# --8<-- [start:test_followups]
@pytest.mark.claim("C-FORGET-1", "nuanced")
def test_lower_rate_and_l2_pull_keep_a(ev, seed):
    """Three more arms from the same A model and batches. A ten times lower rate keeps A and learns less of B in
    the same 60 steps; an L2 pull towards the A weights (strength 0.1, every weight alike: EWC without the Fisher
    weights) keeps A and still learns B; training the FFN only (embeddings, attention and norms frozen) still
    forgets most of A. Would refute 'a lower rate / a pull to the old weights reduces forgetting' if those arms
    kept no more A than plain fine-tuning."""
    res = results(seed)
    full = res["full fine-tuning"]
    for arm in ("full, lr / 10", "L2 to the A weights", "FFN only"):
        ev.record(f"{arm}: A after B, B reached", [res[arm]["A"], res[arm]["B"]])
        ev.record(f"A kept, {arm} − full fine-tuning", res[arm]["A"] - full["A"])
    # Over seeds 100-139 (mean ± sd, min): A kept minus full fine-tuning's, lr / 10 0.964 ± 0.046 (min 0.836), L2 pull
    # 0.967 ± 0.044 (min 0.830): the bound 0.6 is 8 sd below both means; L2 pull's A and B at least 0.974 on all
    # 40. FFN only minus full 0.214 ± 0.090 (min 0.035): recorded, not asserted.
    assert res["full, lr / 10"]["A"] - full["A"] > 0.6
    assert res["L2 to the A weights"]["A"] - full["A"] > 0.6 and res["L2 to the A weights"]["B"] > 0.9
# --8<-- [end:test_followups]


# %% [markdown]
# ## 5. Bad settings

# %%
def test_bad_settings_raise_config_error(ev):
    """The set-up refuses settings that would silently measure something else: a vocabulary too small to split,
    a replay share that rounds to no old rows (or to all of them), a batch other than the one replay was built
    for, a pull of strength 0. Would fail if any of them trained without complaint."""
    bad = {
        "vocab 4": lambda: halves(4),
        "replay 0": lambda: with_replay(task_b, task_a, 0.0, BATCH),
        "replay 0.1 of a batch of 4": lambda: with_replay(task_b, task_a, 0.1, 4),
        "batch 16 for replay built for 20": lambda: with_replay(task_b, task_a, 0.1, 20)(torch.Generator(), 16, T, V),
        "L2 strength 0": lambda: l2_to_old(DecoderLM(CFG), 0.0),
    }
    for name, call in bad.items():
        with pytest.raises(ConfigError):
            call()
    ev.record("bad settings that raise ConfigError", list(bad))
    x, _ = with_replay(task_b, task_a, 0.1, 20)(torch.Generator().manual_seed(0), 20, T, V)
    a_tokens = set(halves(V)[0])
    rows_from_a = sum(all(t in a_tokens for t in row.tolist()) for row in x)
    ev.record("rows of a replay batch of 20 drawn from A", rows_from_a, expect="2")
    assert rows_from_a == 2
