"""Selective copying (Gu & Dao 2023, §3.1 Fig. 2 and §4.1.1): remember a few tokens scattered among noise, in order.

The Copying task puts the tokens to remember at fixed positions, so a time-invariant model solves it with a fixed
kernel that looks back a fixed distance. Selective copying scatters them at random positions among noise tokens: which
positions matter depends on the content, so the layer has to decide per token what to keep and what to skip.

    x:  span positions, n_data of them data tokens (at random positions, in order), the rest NOISE; then n_data MARKs
    y:  IGNORE everywhere except at the i-th MARK: the i-th data token                              (B, span + n_data)

Token ids: 0 = NOISE, 1..n_colors = data, n_colors + 1 = MARK; vocabulary n_colors + 2. Data tokens are drawn with
replacement, so a token's count does not tell its place: a layer that only weighs inputs by how far back they are
cannot sort two equal tokens from the rest by their weights. IGNORE = -100 is F.cross_entropy's ignore_index, so proofs.train.train scores the answers only.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .mqar import IGNORE
from .transformer.config import ConfigError

NOISE = 0


def copy_vocab(n_colors: int) -> int:
    """Noise, n_colors data tokens and the marker."""
    return n_colors + 2


# --8<-- [start:selective_copy]
def selective_copy(g: torch.Generator, batch: int, span: int, n_data: int, n_colors: int) -> tuple[Tensor, Tensor]:
    """One batch (x, y), each (batch, span + n_data). See the module docstring for the layout."""
    if n_data < 1 or n_data > span:
        raise ConfigError(f"n_data={n_data} data tokens must fit in span={span} positions (and be at least 1).")
    if n_colors < 2:
        raise ConfigError(f"n_colors={n_colors}: copying needs at least two data tokens to choose from.")
    pos = torch.rand(batch, span, generator=g).argsort(dim=1)[:, :n_data].sort(dim=1).values  # (B, n) random, in order
    data = torch.randint(1, n_colors + 1, (batch, n_data), generator=g)  # (B, n), with replacement
    x = torch.full((batch, span + n_data), NOISE, dtype=torch.long)
    x.scatter_(1, pos, data)
    x[:, span:] = n_colors + 1  # the markers
    y = torch.full_like(x, IGNORE)
    y[:, span:] = data  # the i-th marker answers the i-th data token
    return x, y
# --8<-- [end:selective_copy]


def copy_batches(seed: int, batch: int, span: int, n_data: int, n_colors: int):
    """batches(step) -> a fresh seeded batch per step, the same for every arm that uses the same seed."""
    g = torch.Generator().manual_seed(seed)
    cache: list[tuple[Tensor, Tensor]] = []

    def get(step: int) -> tuple[Tensor, Tensor]:
        while len(cache) <= step:
            cache.append(selective_copy(g, batch, span, n_data, n_colors))
        return cache[step]

    return get
