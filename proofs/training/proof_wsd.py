# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
# ---

# %% [markdown]
# # Cosine or warmup-stable-decay (WSD)?
#
# Proofs for `docs/training/wsd-vs-cosine.md`. The schedules are `proofs/schedules.py` (cosine to a floor, WSD
# with a decay fraction and shape, inverse-sqrt), each a `schedule(step) -> multiplier` for the shared trainer
# `proofs.train.train`. Section 1 is exact (the schedules themselves). Sections 2-4 train the shared `DecoderLM`
# (d_model 32, one layer) on `markov_task` (next-token prediction on a fixed 32-token Markov chain) at a peak rate
# high enough that the rate, not the step count, limits the loss: that is the regime a decay helps in.
# A decay is branched from a stable checkpoint with Adam's moments carried over, so the branch is the same run as a
# WSD run of that budget from scratch (checked bit for bit). Thresholds come from seeds 100-139, written beside
# each assert. Run: `pytest proofs/training/proof_wsd.py`.

# %%
from __future__ import annotations

import collections
import contextlib
import copy
import functools

import pytest
import torch
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook
from torch.optim.optimizer import _global_optimizer_post_hooks, _global_optimizer_pre_hooks  # to check none leak

from proofs.schedules import cosine, inverse_sqrt, wsd
from proofs.tasks import markov_entropy, markov_task
from proofs.train import fixed_batches, noam_schedule, token_loss, train
from proofs.transformer import DecoderLM, TransformerConfig
from proofs.transformer.config import ConfigError

# %% [markdown]
# ## 1. The schedules, exactly
#
# Every schedule peaks at 1 (the trainer's `lr` is the peak). WSD's multiplier before its decay does not depend
# on the total: WSD runs of 40, 80 and 160 updates are the same run up to update 32, and the 80- and 160-update
# runs up to update 64. That is the whole trick behind "one run, many budgets". Cosine's multiplier at every step
# after warm-up depends on the total, so a cosine run of one length is no prefix of a longer one.

# %%
# --8<-- [start:toy]
V, LENGTH, BATCH, LR, WARMUP = 32, 16, 16, 3e-2, 10
BUDGETS = (40, 80, 160)  # updates; each WSD budget decays over its last 20 %
DECAY, FLOOR = 0.2, 0.1  # WSD decay fraction (linear to 0); cosine ends at 10 % of the peak
SHORT_DECAYS = (0.025, 0.05, 0.1)  # shorter decays of the 160 budget (4, 8, 16 updates), off the same stable phase
CFG = TransformerConfig(vocab_size=V, d_model=32, n_heads=2, n_layers=1, d_ff=64, norm_position="pre",
                        positions="learned", max_len=LENGTH, dropout_emb=0.0, dropout_residual=0.0)


def held_out(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """256 fresh sequences of the chain, never trained on: (256, LENGTH) inputs and targets."""
    return markov_task(torch.Generator().manual_seed(5_000 + seed), 256, LENGTH, V)


@torch.no_grad()
def loss_on(model: DecoderLM, data) -> float:
    """Mean next-token cross-entropy (nats) on held-out data; the chain's entropy is the floor."""
    return token_loss(model.eval()(data[0]), data[1]).item()
# --8<-- [end:toy]


# %% [markdown]
# ## 2. Branching a decay off a stable checkpoint
#
# `train()` builds its own Adam and does not return it. Torch's global optimizer hooks reach it without changing
# the trainer: a post-step hook copies the weights and Adam's moments after chosen updates (a checkpoint), and a
# pre-step hook loads the moments into the fresh Adam of a resumed run before its first update. The resumed run
# reads the same batches and the same schedule from the checkpoint's step on.

# %%
# --8<-- [start:branch]
@contextlib.contextmanager
def after_each_update(model: DecoderLM, fn):
    """Call fn(updates_done, optimizer) after every update of the optimizer that train() builds for model."""
    first, done = next(model.parameters()), 0

    def hook(opt, args, kwargs):
        nonlocal done
        if opt.param_groups[0]["params"][0] is first:  # ours, not another optimizer's
            done += 1
            fn(done, opt)

    handle = register_optimizer_step_post_hook(hook)
    try:
        yield
    finally:
        handle.remove()


def run(seed: int, schedule, steps: int, batches, start=None, checkpoints=(), curve=None):
    """Train for `steps` updates from scratch (start None) or from a checkpoint start = (step, weights, Adam
    state), reading batches(step) and schedule(step) at the run's absolute step. Returns the model and the
    checkpoints {step: (step, weights, Adam state)} taken after the listed absolute steps; curve, if a dict,
    gets the held-out loss every 16 updates and at the end."""
    torch.manual_seed(seed)
    model, k0 = DecoderLM(CFG), 0
    if start is not None:
        k0 = start[0]
        model.load_state_dict(start[1])
    saved, data = {}, held_out(seed)
    if curve is not None and start is not None:
        curve[k0] = loss_on(model, data)

    def keep(done: int, opt) -> None:
        if k0 + done in checkpoints:
            saved[k0 + done] = (k0 + done, copy.deepcopy(model.state_dict()), copy.deepcopy(opt.state_dict()["state"]))
        if curve is not None and ((k0 + done) % 16 == 0 or done == steps):
            curve[k0 + done] = loss_on(model, data)
            model.train()

    def resume_adam(opt, args, kwargs):  # once, before the first update: Adam's moments and step count
        if start is not None and opt.param_groups[0]["params"][0] is first and not opt.state:
            state = opt.state_dict()
            state["state"] = copy.deepcopy(start[2])
            opt.load_state_dict(state)  # keeps the param groups, so the schedule's rate stands

    first = next(model.parameters())
    handle = register_optimizer_step_pre_hook(resume_adam)
    try:
        with after_each_update(model, keep):
            train(model, lambda s: batches(k0 + s), steps, lr=LR, schedule=lambda s: schedule(k0 + s))
    finally:
        handle.remove()
    return model, saved
# --8<-- [end:branch]


# %% [markdown]
# ## 3. The arms of one seed
#
# One WSD run of the longest budget (160 updates) keeps checkpoints of its stable phase at updates 32 and 64 and
# at 128, where its own decay starts. Decays of 8 and 16 updates branch from 32 and 64: the WSD runs of 40 and 80
# updates. A constant-rate continuation of the stable run from 128 to 160 is the no-decay control, and its
# checkpoints at 144, 152 and 156 give shorter decays of the 160 budget (10 %, 5 % and 2.5 %).
# Cosine needs one run per budget; inverse-sqrt one at 160. Every arm of a seed starts from the same weights and
# reads the same batches.

# %%
# --8<-- [start:arms]
@functools.lru_cache(maxsize=4)
def arms(seed: int, curves: bool = False) -> dict:
    """Final held-out losses {(arm, budget): nats}, updates counted per schedule family, the branched WSD-40
    model's weights, and (curves=True) held-out loss curves {run name: {update: nats}} for the plot."""
    batches, data = fixed_batches(markov_task, 1_000 + seed, BATCH, LENGTH, V), held_out(seed)
    big = BUDGETS[-1]
    out, steps, weights = {}, {"wsd": 0, "cosine": 0}, None
    c = collections.defaultdict(dict)
    curve = lambda name: c[name] if curves else None
    stable_at = {round((1 - DECAY) * b) for b in BUDGETS}  # 32, 64, 128
    model, ckpt = run(seed, wsd(big, WARMUP, DECAY), big, batches, checkpoints=stable_at, curve=curve(f"WSD {big}"))
    out["wsd", big], steps["wsd"] = loss_on(model, data), big
    for b in BUDGETS[:-1]:  # decays branched off the one stable run
        k = round((1 - DECAY) * b)
        model, _ = run(seed, wsd(b, WARMUP, DECAY), b - k, batches, start=ckpt[k], curve=curve(f"WSD {b} (branch)"))
        out["wsd", b] = loss_on(model, data)
        steps["wsd"] += b - k
        weights = weights if b != BUDGETS[0] else copy.deepcopy(model.state_dict())
    for b in BUDGETS:  # cosine: a separate run per budget
        model, _ = run(seed, cosine(b, WARMUP, FLOOR), b, batches, curve=curve(f"cosine {b}"))
        out["cosine", b] = loss_on(model, data)
        steps["cosine"] += b
    model, _ = run(seed, inverse_sqrt(WARMUP), big, batches, curve=curve("inverse-sqrt"))
    out["inverse-sqrt", big] = loss_on(model, data)
    k = round((1 - DECAY) * big)  # the decay of the 160 budget and its no-decay control, from update 128
    model, late = run(seed, lambda s: 1.0, big - k, batches, start=ckpt[k],
                      checkpoints=set(range(k + 1, big + 1)),  # every iterate: the shorter decays and the average
                      curve=curve("constant (no decay)"))
    out["constant", big], out["stable checkpoint", k] = loss_on(model, data), loss_on_checkpoint(ckpt[k], data)
    # no decay at all, but the uniform average of the 32 constant-rate iterates 129-160 (stochastic weight averaging)
    names = late[big][1].keys()
    mean = {n: sum(late[j][1][n] for j in range(k + 1, big + 1)) / (big - k) for n in names}
    out["average of the constant-rate iterates", big] = loss_on_checkpoint((big, mean), data)
    b, j = BUDGETS[0], round((1 - DECAY) * BUDGETS[0])  # the WSD-40 branch once more, its Adam restarted from zero
    model, _ = run(seed, wsd(b, WARMUP, DECAY), b - j, batches, start=(j, ckpt[j][1], {}))
    out["wsd, fresh Adam at the branch", b], fresh = loss_on(model, data), copy.deepcopy(model.state_dict())
    for frac in SHORT_DECAYS:  # the same budget, shorter decays branched off the stable phase
        k = big - round(frac * big)
        model, _ = run(seed, wsd(big, WARMUP, frac), big - k, batches, start=late[k])
        out[f"wsd {frac:.1%} decay", big] = loss_on(model, data)
    out[f"wsd {DECAY:.1%} decay", big] = out["wsd", big]
    return {"loss": out, "steps": steps, "curves": dict(c), "branched wsd 40": weights, "fresh-Adam wsd 40": fresh}


def loss_on_checkpoint(ckpt, data) -> float:
    model = DecoderLM(CFG)
    model.load_state_dict(ckpt[1])
    return loss_on(model, data)
# --8<-- [end:arms]


SEEDS = 1  # seeds per proof run (seed, ..., seed + SEEDS - 1): each run costs about 3 s on one thread


def mean_over(seed: int, key) -> float:
    return sum(arms(s, s == seed)["loss"][key] for s in range(seed, seed + SEEDS)) / SEEDS


# %% [markdown]
# ## The tests

# %%
# --8<-- [start:test_schedules]
def test_schedules_and_bad_settings(ev):
    """Exact, our module: WSD's multiplier up to its decay does not depend on the budget (so one stable run is a
    prefix of every WSD run), cosine's does; inverse-sqrt is the Transformer schedule (noam_schedule) rescaled to
    peak 1; each schedule ends where it says. Bad settings raise ConfigError. Would fail if the WSD prefixes
    differed (then no run could serve two budgets)."""
    s40, s160 = wsd(40, WARMUP, DECAY), wsd(160, WARMUP, DECAY)
    same = max(abs(s40(s) - s160(s)) for s in range(32))
    c40, c160 = cosine(40, WARMUP, FLOOR), cosine(160, WARMUP, FLOOR)
    ev.record("WSD 40 vs WSD 160: largest multiplier gap over updates 0-31", same, expect="0: a shared prefix")
    ev.record("cosine 40 vs cosine 160: largest multiplier gap over updates 0-31",
              max(abs(c40(s) - c160(s)) for s in range(32)), expect="> 0: no shared prefix")
    noam = noam_schedule(32, WARMUP)
    gap = max(abs(inverse_sqrt(WARMUP)(s) - noam(s) * (32 * WARMUP) ** 0.5) for s in range(1000))
    ev.record("inverse-sqrt vs noam_schedule x sqrt(d_model * warmup): largest gap", gap, expect="float rounding")
    ev.record("WSD 160: decay starts at update", s160.decay_start)
    ev.record("WSD 160: multiplier of the last update (linear to 0)", s160(159), expect="1/32")
    ev.record("cosine 160: multiplier of the last update", c160(159), expect="just above 0.1")
    assert same == 0 and max(abs(c40(s) - c160(s)) for s in range(WARMUP, 32)) > 0.1
    assert gap < 1e-12 and s160.decay_start == 128 and s160(127) == 1 and s160(159) == pytest.approx(1 / 32)
    assert FLOOR < c160(159) < FLOOR + 1e-3 and c160(WARMUP - 1) == 1 and s160(0) == 1 / WARMUP
    assert wsd(100, 0, 0.2, "1-sqrt")(80 + 16) == pytest.approx(1 - 0.8 ** 0.5)
    bad = {"decay fraction 0": lambda: wsd(100, 10, 0.0), "decay fraction 1.5": lambda: wsd(100, 10, 1.5),
           "warmup >= total": lambda: cosine(100, 100), "decay inside warm-up": lambda: wsd(100, 50, 0.6),
           "unknown shape": lambda: wsd(100, 10, 0.2, "exp"), "floor 1": lambda: cosine(100, 10, 1.0),
           "inverse-sqrt warmup 0": lambda: inverse_sqrt(0)}
    for name, make in bad.items():
        with pytest.raises(ConfigError):
            make()
    ev.record("bad settings that raise ConfigError", len(bad))
# --8<-- [end:test_schedules]


def _plot_schedules(ev) -> None:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 3.0))
    big = BUDGETS[-1]
    ax.plot([cosine(big, WARMUP, FLOOR)(s) for s in range(big)], label="cosine to 10 %")
    ax.plot([wsd(big, WARMUP, DECAY)(s) for s in range(big)], label="WSD, 20 % linear decay")
    ax.plot([wsd(big, WARMUP, DECAY, "1-sqrt")(s) for s in range(big)], ls=":", label="WSD, 20 % 1-sqrt decay")
    ax.plot([inverse_sqrt(WARMUP)(s) for s in range(big)], label="inverse-sqrt")
    for b in BUDGETS[:-1]:
        ax.plot(range(round((1 - DECAY) * b), b), [wsd(b, WARMUP, DECAY)(s) for s in range(round((1 - DECAY) * b), b)],
                color="C1", ls="--", lw=1)
    ax.set_xlabel("update")
    ax.set_ylabel("multiplier of the peak rate")
    ax.legend(fontsize=7)
    ax.set_title("WSD's branches (dashed) leave one stable run")
    fig.tight_layout()
    ev.figure(fig, "schedules", caption="The schedules of the proof, 160 updates, warm-up 10; dashed: the decays "
              "of the 40- and 80-update WSD budgets, branched off the same stable phase.")
    plt.close(fig)


def _plot_curves(ev, seed: int) -> None:
    import matplotlib.pyplot as plt

    c = arms(seed, True)["curves"]
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    style = {"WSD": dict(color="C1"), "cosine": dict(color="C0"), "inverse-sqrt": dict(color="C2"),
             "constant (no decay)": dict(color="0.5", ls=":")}
    for name, pts in c.items():
        kw = next(v for k, v in style.items() if name.startswith(k))
        xs = sorted(pts)
        ax.plot(xs, [pts[x] for x in xs], lw=1.6 if name.endswith(str(BUDGETS[-1])) else 1,
                ls="--" if "branch" in name else kw.get("ls", "-"), color=kw["color"], label=name)
    ax.axhline(markov_entropy(V), color="k", lw=0.6)
    ax.set_ylim(markov_entropy(V) - 0.05, 2.6)
    ax.set_xlabel("update")
    ax.set_ylabel("held-out loss (nats)")
    ax.legend(fontsize=6.5, ncol=2)
    ax.set_title(f"Seed {seed}: one WSD run and its branches vs a cosine run per budget")
    fig.tight_layout()
    ev.figure(fig, "heldout", caption="Held-out loss every 16 updates. Dashed: WSD decays branched off the "
              "160-update run's stable phase; cosine needs a run per budget. Black line: the chain's entropy.")
    plt.close(fig)


# --8<-- [start:test_match]
@pytest.mark.claim("C-WSD-1", "nuanced")
def test_wsd_matches_cosine_at_equal_steps(ev, seed):
    """160 updates, the same peak, warm-up, batches and initial weights: WSD (20 % linear decay to 0) ends level
    with cosine to 10 % and both end below inverse-sqrt and a constant rate. Would be refuted if WSD ended clearly
    above cosine, and would say nothing about decay if the constant rate did as well."""
    big = BUDGETS[-1]
    m = {name: mean_over(seed, (name, big)) for name in ("wsd", "cosine", "inverse-sqrt", "constant")}
    for name, v in m.items():
        ev.record(f"held-out loss after {big} updates: {name}", v)
    ev.record("chain entropy (the floor)", markov_entropy(V), key=False)
    ev.record("WSD minus cosine", m["wsd"] - m["cosine"], expect="about 0")
    ev.record("inverse-sqrt minus WSD", m["inverse-sqrt"] - m["wsd"], expect="> 0")
    ev.record("constant minus WSD", m["constant"] - m["wsd"], expect="> 0")
    _plot_schedules(ev)
    # THRESHOLDS from seeds 100-139 (40 seeds, one per run): WSD - cosine -0.0028 +- 0.0074 (min -0.020, max 0.0089);
    # inverse-sqrt - WSD 0.033 +- 0.0097 (min 0.011); constant - WSD 0.043 +- 0.012 (min 0.017)
    assert abs(m["wsd"] - m["cosine"]) < 0.035  # 4.4 sd from the mean on either side
    assert m["inverse-sqrt"] - m["wsd"] > 0 and m["constant"] - m["wsd"] > 0  # signs only: 3.4 and 3.6 sd
# --8<-- [end:test_match]


# --8<-- [start:test_branch]
@pytest.mark.claim("C-WSD-1", "nuanced")
def test_one_stable_run_serves_three_budgets(ev, seed):
    """Budgets of 40, 80 and 160 updates. WSD: one run of 160 updates whose stable checkpoints at 32 and 64 get
    decays of 8 and 16 updates; cosine: three runs. The branch off the stable run is the WSD run of its budget
    from scratch, bit for bit (an identity of the set-up: the schedules share the prefix and Adam's moments are
    carried). The update count is a count of our design, not a measurement. What is measured: the branched
    losses against cosine's at each budget. Would be refuted if a branched decay ended clearly above the cosine
    run of its budget."""
    hooks = len(_global_optimizer_pre_hooks) + len(_global_optimizer_post_hooks)
    scratch, _ = run(seed, wsd(BUDGETS[0], WARMUP, DECAY), BUDGETS[0],
                     fixed_batches(markov_task, 1_000 + seed, BATCH, LENGTH, V))
    leaked = len(_global_optimizer_pre_hooks) + len(_global_optimizer_post_hooks) - hooks
    ev.record("torch global optimizer hooks left behind by a run", leaked, expect="0: removed in a finally")
    a = arms(seed, True)
    branched, fresh = a["branched wsd 40"], a["fresh-Adam wsd 40"]
    diff = max((scratch.state_dict()[k] - branched[k]).abs().max().item() for k in branched)
    ev.record("branched WSD 40 vs WSD 40 from scratch: largest weight difference", diff, expect="0")
    # the switch flipped: the same branch with Adam's moments and step count dropped at the checkpoint
    diff_fresh = max((scratch.state_dict()[k] - fresh[k]).abs().max().item() for k in fresh)
    ev.record("branch with a fresh Adam vs WSD 40 from scratch: largest weight difference", diff_fresh,
              expect="> 0: the identity needs the optimizer state")
    ev.record("budget 40: held-out loss, fresh-Adam branch minus carried-Adam branch",
              a["loss"]["wsd, fresh Adam at the branch", BUDGETS[0]] - a["loss"]["wsd", BUDGETS[0]])
    steps = arms(seed, True)["steps"]
    ev.record("updates for budgets 40, 80, 160: WSD (one run + two branched decays)", steps["wsd"],
              expect="160 + 8 + 16 = 184")
    ev.record("updates for budgets 40, 80, 160: cosine (three runs)", steps["cosine"], expect="40 + 80 + 160 = 280")
    ev.record("updates saved by branching", steps["cosine"] - steps["wsd"])
    gaps = {}
    for b in BUDGETS:
        w, c = mean_over(seed, ("wsd", b)), mean_over(seed, ("cosine", b))
        ev.record(f"budget {b}: held-out loss WSD, cosine", [round(w, 4), round(c, 4)])
        gaps[b] = w - c
        ev.record(f"budget {b}: WSD minus cosine", gaps[b], key=False)
    _plot_curves(ev, seed)
    assert diff == 0 and diff_fresh > 1e-3 and leaked == 0  # fresh-Adam gap: 0.189 on seed 0, see the seed record
    assert steps == {"wsd": 184, "cosine": 280}
    # THRESHOLDS from seeds 100-139 (40 seeds): WSD - cosine at 40 updates -0.086 +- 0.026 (max -0.006), at 80
    # -0.041 +- 0.018 (max -0.005), at 160 -0.0028 +- 0.0074 (max 0.0089)
    for b in BUDGETS:
        assert gaps[b] < 0.03  # 4.4 sd above the mean at 160, farther at 40 and 80
# --8<-- [end:test_branch]


# --8<-- [start:test_decay]
@pytest.mark.claim("C-WSD-1", "nuanced")
def test_the_loss_drops_during_the_decay(ev, seed):
    """From the stable checkpoint at update 128 the last 32 updates are run twice: with WSD's linear decay and at
    the constant peak rate. Most of what the decay buys arrives in it: the decayed run drops well below the
    constant one. The stable checkpoint is no finished model, and a decay that is too short (2.5 %, 5 %, 10 % of the
    run) ends above the 20 % decay and, on average, above cosine: the 'matches cosine' half holds for a long enough
    decay. Recorded, not asserted: the uniform average of the 32 constant-rate iterates (no decay at all), the
    river-valley reading's prediction of where a decay lands. Would be confirmed without nuance if the 2.5 % decay
    ended as low as the 20 % one; refuted if the decay dropped no more than the constant rate."""
    big, k = BUDGETS[-1], round((1 - DECAY) * BUDGETS[-1])
    ck, w, const, cos = (mean_over(seed, key) for key in (("stable checkpoint", k), ("wsd", big), ("constant", big),
                                                          ("cosine", big)))
    ev.record(f"held-out loss at the stable checkpoint (update {k})", ck)
    ev.record(f"drop over updates {k}-{big}: with the decay", ck - w)
    ev.record(f"drop over updates {k}-{big}: constant rate", ck - const)
    ev.record("decay's extra drop (constant minus WSD)", const - w, expect="> 0")
    short = {}
    for frac in (*SHORT_DECAYS, DECAY):
        short[frac] = mean_over(seed, (f"wsd {frac:.1%} decay", big)) - cos
        ev.record(f"WSD with a {frac:.1%} decay minus cosine, {big} updates", short[frac])
    ev.record("5% decay minus 20% decay", short[0.05] - short[DECAY], expect="> 0: too short a decay lags")
    ev.record("2.5% decay minus 20% decay", short[0.025] - short[DECAY], expect="> 0: MiniCPM's too-short decay")
    avg = mean_over(seed, ("average of the constant-rate iterates", big))
    ev.record(f"held-out loss at {big}: average of the constant-rate iterates {k + 1}-{big}", avg)
    ev.record("constant minus its own average (what averaging buys)", const - avg, expect="> 0")
    ev.record("average of the constant-rate iterates minus WSD", avg - w)
    # THRESHOLDS from seeds 100-139 (40 seeds): constant - WSD 0.043 +- 0.012 (min 0.017); 5% decay - cosine
    # 0.022 +- 0.011 (min 0.0017), 10% 0.0098 +- 0.0097; 5% - 20% decay 0.025 +- 0.0081 (min 0.011): 3.1 sd, too thin
    # to assert, so it is recorded only. Asserted instead: MiniCPM's too-short decay, 2.5% - 20%; its spread over
    # seeds 100-139 is the '2.5% decay minus 20% decay' row of bench/seeds/training/proof_wsd.json, recorded with
    # this file. One seed per run (the 8 s budget), so these are signs; none failed in 40 seeds.
    assert const - w > 0
    assert short[0.025] - short[DECAY] > 0
# --8<-- [end:test_decay]
