"""The small language model that the pages of "The modern block" share (RMSNorm, SwiGLU, the parallel block,
mixture of experts, parameter count).

The language: tokens 1..15; the first two tokens of a sequence are uniform, and every later token is, with
probability 0.9, `TABLE[previous-but-one, previous]` (a fixed random table), otherwise uniform. Predicting it needs
attention (to fetch the token before) and a feed-forward lookup of the pair, so the norm, the FFN and the block layout
all matter. Its entropy rate is known exactly, so the loss floor is printed next to every loss.

The model: a 2-layer Pre-LN decoder, d_model 48, 4 heads, ReLU FFN of width 4·48, no biases, sinusoidal positions,
tied embeddings, no dropout. Training: Adam, lr 5e-3, no warm-up, 80 steps of 16 sequences of 16 tokens; loss measured
on 512 held-out sequences. Each arm flips one switch of that configuration, sees the same batches, and is compared with
the baseline on the same seed.
"""

from __future__ import annotations

import functools
import math

import torch
import torch.nn as nn

from proofs.train import fixed_batches, token_loss, train
from proofs.transformer import DecoderLM, TransformerConfig

D = 48  # d_model of every toy in this section (divisible by 3, so that 8/3·d is an integer)


# --8<-- [start:toy_lm]
V, LENGTH, BATCH, STEPS, LR, KEEP = 16, 16, 16, 80, 5e-3, 0.9
TABLE = torch.randint(1, V, (V, V), generator=torch.Generator().manual_seed(0))  # the language, fixed


def markov2_task(g: torch.Generator, batch: int, length: int, vocab: int = V) -> tuple[torch.Tensor, torch.Tensor]:
    """Sequences of the order-2 language; target = the next token."""
    x = torch.empty(batch, length + 1, dtype=torch.long)
    x[:, :2] = torch.randint(1, vocab, (batch, 2), generator=g)
    for t in range(2, length + 1):
        rule = TABLE[x[:, t - 2], x[:, t - 1]]
        noise = torch.randint(1, vocab, (batch,), generator=g)
        x[:, t] = torch.where(torch.rand(batch, generator=g) < KEEP, rule, noise)
    return x[:, :-1], x[:, 1:]


def loss_floor(length: int = LENGTH) -> float:
    """The best possible mean loss: position 0 cannot know its next token (ln 15), the others follow the rule."""
    p_rule = KEEP + (1 - KEEP) / (V - 1)
    p_other = (1 - KEEP) / (V - 1)
    h = -p_rule * math.log(p_rule) - (V - 2) * p_other * math.log(p_other)
    return (math.log(V - 1) + (length - 1) * h) / length


def block_cfg(**switches) -> TransformerConfig:
    base = dict(vocab_size=V, d_model=D, n_heads=4, d_ff=4 * D, n_layers=2, norm_position="pre", bias=False,
                positions="sinusoidal", dropout_emb=0.0, dropout_residual=0.0)
    return TransformerConfig(**{**base, **switches})


@functools.cache
def _lm_run(seed: int, switches: tuple, steps: int, lr: float, aux_weight: float, zero_norm_bias: bool):
    torch.manual_seed(seed)
    model = DecoderLM(block_cfg(**dict(switches)))
    for m in model.modules():
        if zero_norm_bias and isinstance(m, nn.LayerNorm):  # this proof's intervention, not a model switch
            m.bias.requires_grad_(False).zero_()
    balance = (lambda m: aux_weight * m.aux_loss()) if aux_weight else None  # mixture of experts only
    log = train(model, fixed_batches(markov2_task, 1000 + seed, BATCH, LENGTH, V), steps, lr=lr, extra_loss=balance)
    x, y = markov2_task(torch.Generator().manual_seed(10_000 + seed), 512, LENGTH)
    with torch.no_grad():
        held_out = token_loss(model(x), y).item()
    return {"model": model, "log": log, "held_out": held_out}


def lm_run(seed: int, steps: int = STEPS, lr: float = LR, aux_weight: float = 0.0, zero_norm_bias: bool = False,
           **switches) -> dict:
    """One trained arm (cached: every test of a file reuses it): the model, its TrainLog, held-out loss.
    aux_weight > 0 adds that multiple of the mixture of experts' load-balancing loss to the training loss;
    zero_norm_bias=True fixes every LayerNorm's bias at 0 (LayerNorm minus RMSNorm's missing bias)."""
    return _lm_run(seed, tuple(sorted(switches.items())), steps, lr, aux_weight, zero_norm_bias)


# The section's reference effect: SwiGLU at 8/3·d against the ReLU FFN at 4d, the one change the section calls clearly
# better (docs/blocks/swiglu.md). The "about as well" verdicts are measured against it on the same seeds.
SWIGLU_REFERENCE = dict(ffn_gated=True, activation="silu", d_ff=8 * D // 3)


def paired(seeds: list[int], arm: dict, base: dict | None = None) -> dict:
    """Held-out losses of an arm and of the baseline on the same seeds, and their differences (arm − base)."""
    a = [lm_run(s, **arm)["held_out"] for s in seeds]
    b = [lm_run(s, **(base or {}))["held_out"] for s in seeds]
    diffs = [x - y for x, y in zip(a, b)]
    return {"arm": a, "base": b, "diffs": diffs, "mean_diff": sum(diffs) / len(diffs)}
# --8<-- [end:toy_lm]
