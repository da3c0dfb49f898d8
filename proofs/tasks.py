"""Synthetic tasks: seeded, no downloads, each a few lines.

Every generator takes a `torch.Generator` and returns LongTensors, so a proof
can draw the same batches for both arms of an ablation.
"""

from __future__ import annotations

import torch
from torch import Tensor

PAD = 0  # token 0 is padding wherever a task pads


def random_tokens(g: torch.Generator, batch: int, length: int, vocab: int, low: int = 1) -> Tensor:
    """(batch, length) tokens uniform in [low, vocab)."""
    return torch.randint(low, vocab, (batch, length), generator=g)


def copy_task(g: torch.Generator, batch: int, length: int, vocab: int) -> tuple[Tensor, Tensor]:
    """Target = input. Needs no position information."""
    x = random_tokens(g, batch, length, vocab)
    return x, x.clone()


def reverse_task(g: torch.Generator, batch: int, length: int, vocab: int) -> tuple[Tensor, Tensor]:
    """Target at position t is the input at position T-1-t: impossible without positions."""
    x = random_tokens(g, batch, length, vocab)
    return x, x.flip(1)


def previous_token_task(g: torch.Generator, batch: int, length: int, vocab: int) -> tuple[Tensor, Tensor]:
    """Target at position t is the input at t-1 (position 0 predicts itself).

    The relation is directed: t looks at t-1, never t+1. Under bidirectional
    attention the model must tell its left neighbour from its right one.
    """
    x = random_tokens(g, batch, length, vocab)
    y = torch.cat([x[:, :1], x[:, :-1]], dim=1)
    return x, y


def padded_batch(g: torch.Generator, lengths: list[int], max_len: int, vocab: int) -> tuple[Tensor, Tensor]:
    """Random sequences with the given lengths, right-padded with PAD; returns (ids, padding_mask)."""
    ids = torch.full((len(lengths), max_len), PAD, dtype=torch.long)
    for i, n in enumerate(lengths):
        ids[i, :n] = torch.randint(1, vocab, (n,), generator=g)
    return ids, ids == PAD


# --8<-- [start:lookup]
def lookup_table(vocab: int) -> Tensor:
    """A fixed shuffle of the real tokens 1..vocab-1 (the same for every seed): token t -> table[t - 1]."""
    return torch.randperm(vocab - 1, generator=torch.Generator().manual_seed(0)) + 1


def lookup_task(g: torch.Generator, batch: int, length: int, vocab: int, noise: float = 0.0) -> tuple[Tensor, Tensor]:
    """Each token's target is lookup_table[token]: a per-token map that needs no attention at all.

    With noise > 0 each label is replaced, with that probability, by a random token: a task a model
    can only fit by memorising, so its train/validation gap measures over-fitting.
    """
    x = random_tokens(g, batch, length, vocab)
    y = lookup_table(vocab)[x - 1]
    if noise > 0:
        flip = torch.rand(batch, length, generator=g) < noise
        y = torch.where(flip, random_tokens(g, batch, length, vocab), y)
    return x, y
# --8<-- [end:lookup]


def markov_table(vocab: int, sharpness: float = 3.0) -> Tensor:
    """A fixed (vocab, vocab) transition matrix, the same for every seed: row t = softmax(sharpness · N(0, 1))."""
    g = torch.Generator().manual_seed(7)
    return torch.softmax(sharpness * torch.randn(vocab, vocab, generator=g), dim=-1)


def markov_entropy(vocab: int, sharpness: float = 3.0) -> float:
    """Mean next-token entropy (nats) of markov_table's rows: the loss floor of a model that has learnt the chain,
    averaged uniformly over the current token (markov_task starts uniform; the chain's mixing keeps it near)."""
    p = markov_table(vocab, sharpness)
    return float(-(p * p.log()).sum(-1).mean())


def markov_task(g: torch.Generator, batch: int, length: int, vocab: int) -> tuple[Tensor, Tensor]:
    """Language modelling on a first-order Markov chain (markov_table): target = the next token. The loss cannot
    fall below the chain's entropy, so a run that fails shows as a loss stuck above that floor."""
    p = markov_table(vocab)
    x = torch.empty(batch, length + 1, dtype=torch.long)
    x[:, 0] = torch.randint(0, vocab, (batch,), generator=g)
    for t in range(length):
        x[:, t + 1] = torch.multinomial(p[x[:, t]], 1, generator=g)[:, 0]
    return x[:, :-1], x[:, 1:]
