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
# only, plus two recorded arms at a rate of their own (full at lr / 5, LoRA r = 1 at 3 × lr) and a weight average
# of the A model and the fine-tuned one. Measured: A accuracy before and after, B accuracy reached, and how much of
# A comes back by naming the task (argmax among A's answers) or re-fitting only the output biases. Thresholds come from seeds 100-139 and are
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
LR, LOW_LR = 1e-2, 1e-3                  # Adam; every arm at LR except the arms named after their rate
LORA_HIGH_LR = 3e-2                      # LoRA's best rate is usually higher than full fine-tuning's (Biderman et al. App. B)
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
        r = int(arm.split("=")[1].split(",")[0])
        torch.manual_seed(10_000 + seed)  # A's random init: the same whichever tests ran before
        apply_lora(model, TARGETS, r=r, alpha=2.0 * r)
        lr = LORA_HIGH_LR if arm.endswith("lr × 3") else LR
    elif arm == "replay 10 %":
        task = with_replay(task_b, task_a, REPLAY, BATCH)
    elif arm == "full, lr / 10":
        lr = LOW_LR
    elif arm == "full, lr / 5":
        lr = LR / 5
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
        "L2 to the A weights", "FFN only", "full, lr / 5", "LoRA r=1, lr × 3")


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
# ## 1b. How much of A is really gone? The answers are two disjoint token sets

# %%
def answer_tokens(which: int) -> torch.Tensor:
    """The answer tokens of task A (0) or B (1): the table applied to that task's input half."""
    return lookup_table(V)[torch.tensor(list(halves(V)[which])) - 1]


def accuracy_among_a_answers(model, seed: int) -> float:
    """A accuracy when the argmax is taken over A's answer tokens only (the task is named at test time)."""
    x, y = task_a(torch.Generator().manual_seed(9_000 + seed), 256, T, V)
    mask = torch.full((V,), float("-inf"))
    mask[answer_tokens(0)] = 0.0
    with torch.no_grad():
        return ((model.eval()(x) + mask).argmax(-1) == y).float().mean().item()


def refit_output_bias(model, seed: int, steps: int = 60) -> tuple[float, float]:
    """Freeze the fine-tuned model, learn only a V-vector added to its logits (V numbers) on fresh batches that
    are half A, half B, then score A and B: how much of A comes back by shifting the output, nothing else."""
    bias = torch.zeros(V, requires_grad=True)
    opt = torch.optim.Adam([bias], lr=0.1)
    g = torch.Generator().manual_seed(5_000 + seed)  # not the evaluation batches (9_000 + seed)
    for _ in range(steps):
        (xa, ya), (xb, yb) = task_a(g, BATCH // 2, T, V), task_b(g, BATCH // 2, T, V)
        with torch.no_grad():
            logits = model.eval()(torch.cat([xa, xb]))
        loss = torch.nn.functional.cross_entropy((logits + bias).reshape(-1, V), torch.cat([ya, yb]).reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
    scores = []
    for task in (task_a, task_b):
        x, y = task(torch.Generator().manual_seed(9_000 + seed), 256, T, V)
        with torch.no_grad():
            scores.append(((model(x) + bias.detach()).argmax(-1) == y).float().mean().item())
    return scores[0], scores[1]


# --8<-- [start:test_shift]
@pytest.mark.claim("C-FORGET-1", "nuanced")
def test_most_of_full_fine_tunings_loss_is_an_output_shift(ev, seed):
    """A's answers and B's answers are disjoint token sets, so 'forgetting' A can be a shift of the output towards
    B's answers with A's map still intact underneath. Two probes on the fully fine-tuned model: the argmax over
    A's answer tokens only, and re-fitting nothing but a bias on the 32 logits (on fresh A + B batches). Both
    bring most of A back; for LoRA r = 16 they bring back far less. Would refute 'mostly a shift' if A among its
    own answers stayed near the plain A accuracy after full fine-tuning, or the bias re-fit left A low."""
    res = results(seed)
    full, r16 = fine_tune_on_b(seed, "full fine-tuning"), fine_tune_on_b(seed, "LoRA r=16")
    among_full, among_r16 = accuracy_among_a_answers(full, seed), accuracy_among_a_answers(r16, seed)
    bias_full, bias_r16 = refit_output_bias(full, seed), refit_output_bias(r16, seed)
    ev.record("full fine-tuning: A accuracy, plain argmax", res["full fine-tuning"]["A"])
    ev.record("full fine-tuning: A accuracy, argmax among A's answers", among_full, expect="> 0.5 (asserted)")
    ev.record("full fine-tuning: A, B after re-fitting only the 32 output biases", list(bias_full))
    ev.record("LoRA r=16: A accuracy, plain argmax", res["LoRA r=16"]["A"])
    ev.record("LoRA r=16: A accuracy, argmax among A's answers", among_r16)
    ev.record("LoRA r=16: A, B after re-fitting only the 32 output biases", list(bias_r16))
    # Probe over seeds 100-109 (mean ± sd, min; the 40-seed spread, 100-139, is in the seed record): full fine-tuning
    # A plain 0.032 ± 0.045 (max 0.13), among A's answers 0.848 ± 0.045 (min 0.78), after the bias re-fit 0.903 ±
    # 0.082 (min 0.73) with B 0.999 (min 0.997): both gains above 0.4 have ~9 sd of margin. LoRA r=16: among A's
    # answers 0.226 ± 0.107, bias re-fit 0.213 ± 0.089 (recorded, not asserted).
    assert among_full - res["full fine-tuning"]["A"] > 0.4
    assert bias_full[0] - res["full fine-tuning"]["A"] > 0.4 and bias_full[1] > 0.9
# --8<-- [end:test_shift]


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
    # is above 0.29 on every seed (bound 0.2, 4.8 sd); the B difference is 0.471 ± 0.110 (min 0.275): the bound 0
    # is 4.3 sd below the mean, the thinnest margin here.
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
    forgets most of A; averaging the A weights with the fully fine-tuned ones (1:1, as WiSE-FT does) keeps A and
    most of B. Recorded, not asserted: full fine-tuning at a fifth of the rate, LoRA r = 1 at three times the rate
    (a rate per arm instead of one shared rate), and the A model's accuracy with its FFN output zeroed (how much
    of the map lives outside the FFN). Would refute 'a lower rate / a pull to the old weights / averaging reduces
    forgetting' if those arms kept no more A than plain fine-tuning."""
    res = results(seed)
    full = res["full fine-tuning"]
    for arm in ("full, lr / 10", "L2 to the A weights", "FFN only", "full, lr / 5", "LoRA r=1, lr × 3"):
        ev.record(f"{arm}: A after B, B reached", [res[arm]["A"], res[arm]["B"]])
        ev.record(f"A kept, {arm} − full fine-tuning", res[arm]["A"] - full["A"])
    a_model, tuned = model_after_a(seed), fine_tune_on_b(seed, "full fine-tuning")
    averaged = copy.deepcopy(a_model)  # WiSE-FT-style: the mean of the A weights and the fine-tuned weights
    averaged.load_state_dict({k: 0.5 * v + 0.5 * tuned.state_dict()[k] for k, v in a_model.state_dict().items()})
    avg = {"A": accuracy(averaged, task_a, seed), "B": accuracy(averaged, task_b, seed)}
    ev.record("weights averaged, A model and full fine-tuning (1:1): A, B", [avg["A"], avg["B"]])
    ffn_off = copy.deepcopy(a_model)
    for name, p in ffn_off.named_parameters():
        if ".ffn." in name and "lin2" in name:
            p.data.zero_()
    ev.record("A model with its FFN output zeroed: A accuracy", accuracy(ffn_off, task_a, seed))
    # Over seeds 100-139 (mean ± sd, min): A kept minus full fine-tuning's, lr / 10 0.964 ± 0.046 (min 0.836), L2 pull
    # 0.967 ± 0.044 (min 0.830): the bound 0.6 is 8 sd below both means; L2 pull's A and B at least 0.974 on all
    # 40. FFN only minus full 0.214 ± 0.090 (min 0.035): recorded, not asserted. Probe over seeds 100-109 (40-seed
    # spread in the seed record): averaged weights A 0.990 ± 0.017 (min 0.943), B 0.985 ± 0.023 (min 0.933), so
    # A gain > 0.6 and B > 0.8 have >= 6 sd; full at lr / 5 A 0.915 ± 0.062, B 0.998; LoRA r=1 at 3e-2 A 0.017,
    # B 0.335; A model with FFN output zeroed: A 0.704 ± 0.105.
    assert res["full, lr / 10"]["A"] - full["A"] > 0.6
    assert res["L2 to the A weights"]["A"] - full["A"] > 0.6 and res["L2 to the A weights"]["B"] > 0.9
    assert avg["A"] - full["A"] > 0.6 and avg["B"] > 0.8
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
