"""Multi-query associative recall (MQAR): the recall task of the "beyond softmax" pages.

Arora et al. 2023 ("Zoology", §3) show that the gap between attention and the efficient mixers (linear attention,
state-space layers, gated convolutions) on language modelling is mostly a gap in recall, and isolate it in MQAR: a
sequence first lists n key-value pairs, then asks for several of the keys again; the answer at each query is the value
stored under that key. A mixer with a state of fixed size must hold all n pairs in it at once; attention keeps them
all in its cache.

    x:  k_1 v_1 k_2 v_2 … k_n v_n  q_1 q_2 … q_m        (B, 2n + m) token ids
    y:  -100 everywhere except at each q_i: the value stored under q_i       (B, 2n + m)

Keys come from [1, n_keys + 1), values from [n_keys + 1, vocab): disjoint, so a value can never be mistaken for a
key.

fused=True writes each pair as ONE token (id 1 + n_keys + key·n_values + value, a vocabulary of n_keys·n_values pair
tokens) and keeps queries as key tokens, answers as value tokens (ids after the pair tokens):

    x:  p(k_1,v_1) … p(k_n,v_n)  q_1 … q_m               (B, n + m)

In Zoology's two-token format a mixer must first carry each key to the value's position (a previous-token step, a
second layer or a short convolution) before the query can match it, and a two-layer model needs about a thousand
steps on it; in the fused format one layer can retrieve, which is what the recall proofs measure (state size against
pairs), in a few hundred steps. Pages using it say so. Keys within a sequence are distinct (drawn without replacement), so every query has exactly one answer; queries
are drawn from the n stored keys (with replacement). The target -100 is F.cross_entropy's ignore_index, so
proofs.train.train's token loss scores the query positions only.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .transformer.config import ConfigError

IGNORE = -100  # F.cross_entropy's default ignore_index: positions that carry no answer


def mqar_vocab(n_keys: int, n_values: int, fused: bool = False) -> int:
    """The vocabulary an MQAR task of n_keys keys and n_values values needs (token 0 is left unused)."""
    return 1 + n_keys + n_values + (n_keys * n_values if fused else 0)


def mqar(g: torch.Generator, batch: int, n_pairs: int, n_queries: int, n_keys: int, n_values: int,
         fused: bool = False) -> tuple[Tensor, Tensor]:
    """One batch of MQAR: (x, y), each (batch, 2·n_pairs + n_queries), or (batch, n_pairs + n_queries) when fused.
    See the module docstring for the layouts."""
    if n_pairs < 1 or n_queries < 1:
        raise ConfigError(f"MQAR needs at least one pair and one query, got n_pairs={n_pairs}, n_queries={n_queries}.")
    if n_pairs > n_keys:
        raise ConfigError(f"n_pairs={n_pairs} distinct keys cannot be drawn from n_keys={n_keys}: raise n_keys to at "
                          f"least n_pairs.")
    if n_values < 2:
        raise ConfigError(f"n_values={n_values}: recall needs at least two values to choose from.")
    keys = torch.rand(batch, n_keys, generator=g).argsort(dim=1)[:, :n_pairs] + 1  # (B, n) distinct per row
    values = torch.randint(n_keys + 1, n_keys + 1 + n_values, (batch, n_pairs), generator=g)  # (B, n)
    if fused:  # one token per pair: 1 + n_keys + (key - 1)·n_values + (value - n_keys - 1); answers after them
        pairs = 1 + n_keys + (keys - 1) * n_values + (values - n_keys - 1)  # (B, n)
        values = values + n_keys * n_values  # answer ids in [1 + n_keys + n_keys·n_values, vocab)
    else:
        pairs = torch.stack([keys, values], dim=2).reshape(batch, 2 * n_pairs)  # (B, 2n): k_1 v_1 k_2 v_2 …
    which = torch.randint(0, n_pairs, (batch, n_queries), generator=g)  # (B, m) index of the pair each query asks for
    queries = keys.gather(1, which)  # (B, m)
    x = torch.cat([pairs, queries], dim=1)  # (B, 2n + m) or (B, n + m)
    y = torch.full_like(x, IGNORE)
    y[:, pairs.shape[1]:] = values.gather(1, which)  # the answer sits at the query's own position (next-token target)
    return x, y


def mqar_batches(seed: int, batch: int, n_pairs: int, n_queries: int, n_keys: int, n_values: int, fused: bool = False):
    """batches(step) -> a fresh seeded MQAR batch per step, the same for every arm that uses the same seed."""
    g = torch.Generator().manual_seed(seed)
    cache: list[tuple[Tensor, Tensor]] = []

    def get(step: int) -> tuple[Tensor, Tensor]:
        while len(cache) <= step:
            cache.append(mqar(g, batch, n_pairs, n_queries, n_keys, n_values, fused))
        return cache[step]

    return get


@torch.no_grad()
def recall(model: torch.nn.Module, x: Tensor, y: Tensor) -> float:
    """Share of queries answered exactly (argmax at the query positions), in eval mode."""
    model.eval()
    scored = y != IGNORE  # (B, T)
    return (model(x).argmax(-1)[scored] == y[scored]).float().mean().item()
