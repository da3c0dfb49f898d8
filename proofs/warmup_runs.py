"""Lookup-table stacks trained at a high learning rate, with and without warm-up: the set-up of the Pre-/Post-LN,
warm-up, LayerNorm-vs-BatchNorm and deep-initialisation proofs.

A stack of the shared model learns a per-token lookup table (proofs/tasks.py) with Adam. The schedule is the
paper's (section 5.3: linear warm-up, then 1/sqrt(step) decay, peak at step = warmup), scaled so that its peak is
`peak_lr`. "Without warm-up" is the same schedule with the ramp replaced by its peak: the two arms differ only in
the first `warmup` steps.
"""

from __future__ import annotations

import copy
import functools

import torch

from proofs.tasks import lookup_task
from proofs.train import TrainLog, accuracy, fixed_batches, noam_schedule, train
from proofs.transformer import EncoderTagger, TransformerConfig

V = 16  # vocabulary: token 0 is padding, 1..15 are real tokens


def tiny(n_layers: int, **switches) -> TransformerConfig:
    return TransformerConfig(vocab_size=V, d_model=32, n_heads=4, d_ff=64, n_layers=n_layers,
                             dropout_emb=0.0, dropout_residual=0.0).replace(**switches)


# --8<-- [start:warmup]
def schedule(warmup: int, ramp: bool, d_model: int = 32):
    """Noam schedule divided by its peak (so lr=peak_lr sets the peak); ramp=False holds the peak from step 0."""
    noam, peak = noam_schedule(d_model, warmup), d_model**-0.5 * warmup**-0.5
    return lambda step: noam(step if ramp else max(step, warmup - 1)) / peak


def warmup_run(seed: int, ramp: bool, peak_lr: float = 2e-2, warmup: int = 20, steps: int = 80,
               n_layers: int = 4, snapshots: tuple[int, ...] = (), **switches) -> dict:
    """snapshots (step counts below `steps`): result["at"][k] is what this call with steps=k returns, read from
    this run, whose first k steps are that run (the schedule is a function of the step, not of the run's length)."""
    torch.manual_seed(seed)
    model = EncoderTagger(tiny(n_layers, **switches))
    batches = fixed_batches(lookup_task, 1000 + seed, batch=16, length=8, vocab=V)
    copies: dict[int, EncoderTagger] = {}
    log = train(model, _copying(batches, model, snapshots, copies), steps, lr=peak_lr, schedule=schedule(warmup, ramp))
    x, y = lookup_task(torch.Generator().manual_seed(10_000 + seed), 256, 8, V)
    out = {"accuracy": accuracy(model, x, y), "final_loss": log.final(), "loss": log.loss, "diverged": log.diverged}
    if snapshots:
        out["at"] = {k: _stopped_at(k, copies, log, x, y, out) for k in snapshots}
    return out
# --8<-- [end:warmup]


def _copying(batches, model: EncoderTagger, snapshots: tuple[int, ...], copies: dict):
    """batches, plus a copy of the model when step k's batch is asked for: k Adam steps are done by then."""
    def get(step: int):
        if step in snapshots:
            copies[step] = copy.deepcopy(model)
        return batches(step)
    return get


def _stopped_at(k: int, copies: dict, log: TrainLog, x, y, out: dict) -> dict:
    """warmup_run's result for a run of k steps. A run that stopped (diverged) before step k never asked for
    batch k: a run of k steps stopped at the same step, with the same model and losses."""
    if k not in copies:
        return {key: value for key, value in out.items() if key != "at"}
    head = TrainLog(loss=log.loss[:k])
    return {"accuracy": accuracy(copies[k], x, y), "final_loss": head.final(), "loss": head.loss,
            "diverged": head.diverged}


# --8<-- [start:arms]
# The tests' settings, pushed so that the effect shows in a run of seconds (the page names them and says why):
RUN = dict(n_layers=3, steps=50, warmup=20)  # 3 layers, 50 Adam steps, of which 20 are the ramp when there is one
HIGH_LR, LOW_LR = 3e-2, 7.5e-3  # peak learning rates: 30x the trainer's default 1e-3, and a quarter of that


@functools.cache
def arm(seed: int, position: str, ramp: bool, peak_lr: float, norm: str = "layer") -> dict:
    """One training run of warmup_run at RUN's settings (cached: each arm trains once per seed)."""
    return warmup_run(seed, ramp, peak_lr=peak_lr, norm_position=position, norm=norm, **RUN)
# --8<-- [end:arms]
