"""Two lookup tasks on disjoint inputs, for catastrophic forgetting (docs/generation/forgetting.md).

Task A maps every token of the lower half of the vocabulary, [1, V/2), through `proofs.tasks.lookup_table`;
task B maps the upper half, [V/2, V), through the same table. No input token is shared, so a model that has
learnt A can learn B without ever being shown an A token: whatever A loses, it loses through the parameters the
two tasks share (the blocks, the output head and, with tied embeddings, the output rows). Because the table is a
permutation, A's answers and B's answers are also two disjoint sets of tokens.

Also here: replay (a fixed share of each batch drawn from the old task) and an L2 pull towards the old weights
(EWC with the same weight on every parameter), both as things `proofs.train.train` takes: a task callable for
`fixed_batches` and an `extra_loss`. Bad settings raise `ConfigError` naming the fix.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor, nn

from proofs.tasks import lookup_table
from proofs.transformer.config import ConfigError

Task = Callable[[torch.Generator, int, int, int], tuple[Tensor, Tensor]]


def halves(vocab: int) -> tuple[range, range]:
    """The input tokens of task A and of task B: [1, vocab // 2) and [vocab // 2, vocab) (token 0 is padding)."""
    if vocab < 6:
        raise ConfigError(f"vocab={vocab} leaves fewer than 2 input tokens per task: use vocab >= 6.")
    return range(1, vocab // 2), range(vocab // 2, vocab)


def _half_task(which: int) -> Task:
    def task(g: torch.Generator, batch: int, length: int, vocab: int) -> tuple[Tensor, Tensor]:
        tokens = halves(vocab)[which]
        x = torch.randint(tokens.start, tokens.stop, (batch, length), generator=g)  # (batch, length)
        return x, lookup_table(vocab)[x - 1]  # (batch, length): one fixed answer per input token
    task.__name__ = "task_a" if which == 0 else "task_b"
    task.__doc__ = f"Lookup on the {'lower' if which == 0 else 'upper'} half of the vocabulary: (batch, length) x, y."
    return task


task_a: Task = _half_task(0)
task_b: Task = _half_task(1)


def with_replay(new: Task, old: Task, fraction: float, batch: int) -> Task:
    """A task whose batches hold round(fraction · batch) rows of `old` (first) and the rest of `new`.

    `batch` is the batch size the caller will ask for; it is fixed here so that a fraction that rounds to no old
    row at all is caught now instead of silently training without replay.
    """
    if not 0.0 < fraction < 1.0:
        raise ConfigError(f"replay fraction={fraction}: use a share strictly between 0 and 1 "
                          f"(0 is plain fine-tuning, train on `new` directly).")
    k = round(fraction * batch)
    if k == 0 or k == batch:
        raise ConfigError(f"replay fraction={fraction} of a batch of {batch} gives {k} old rows: use a batch of at "
                          f"least {int(1 / fraction + 0.5) + 1} or a larger fraction.")

    def task(g: torch.Generator, b: int, length: int, vocab: int) -> tuple[Tensor, Tensor]:
        if b != batch:
            raise ConfigError(f"with_replay was built for batches of {batch}, asked for {b}: build it with batch={b}.")
        xo, yo = old(g, k, length, vocab)          # (k, length)
        xn, yn = new(g, b - k, length, vocab)      # (b - k, length)
        return torch.cat([xo, xn]), torch.cat([yo, yn])
    return task


def l2_to_old(model: nn.Module, strength: float) -> Callable[[nn.Module], Tensor]:
    """extra_loss for `train`: strength · Σ (θ − θ_old)² over the trainable parameters, θ_old copied now.

    EWC (Kirkpatrick et al. 2017) weights each square by that parameter's Fisher information on the old task;
    this is the same pull with every weight equal (also called L2-SP).
    """
    if strength <= 0:
        raise ConfigError(f"strength={strength}: the pull towards the old weights needs strength > 0.")
    old = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}

    def penalty(m: nn.Module) -> Tensor:
        return strength * sum(((p - old[n]) ** 2).sum() for n, p in m.named_parameters() if n in old)
    return penalty
