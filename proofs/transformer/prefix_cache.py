"""Prefix caching and chunked prefill over the existing contiguous cache (no change to cache.py or models.py).

    PrefixStore       caches of finished prompts keyed by their token ids from position 0; `lookup` hands out a
                      copy of the cache of the longest stored common prefix (SGLang's RadixAttention matches the
                      longest prefix in a radix tree, Zheng et al. 2024, §3; a dict and a linear scan here)
    copy_cache        a deep copy of a Decoder.new_cache() state, optionally cut to n tokens, or with its
                      positions relabelled (the "paste it somewhere else" that prefix caching must NOT do)
    chunked_prefill   feed a prompt to a DecoderLM in chunks of `chunk` tokens through one cache (Sarathi-Serve's
                      chunked prefill, Agrawal et al. 2024, §4), returning every position's logits
    prefill_with_store  look a prompt up, feed only the tokens after the reused prefix, store the result

A cache state is what `Decoder.new_cache()` returns: per layer {"self": KVCache, "cross": KVCache}, the self
cache holding (B, n_kv, T, hs) keys and values with their (B|1, T) positions. Requests are one row each (B = 1).
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from .cache import KVCache
from .config import ConfigError

State = list[dict]  # Decoder.new_cache(): per layer {"self": KVCache, "cross": KVCache}


def _one_row(ids: Tensor) -> Tensor:
    """(T,) or (1, T) integer ids -> (1, T)."""
    if not isinstance(ids, Tensor) or ids.dim() not in (1, 2) or (ids.dim() == 2 and ids.shape[0] != 1):
        got = tuple(ids.shape) if isinstance(ids, Tensor) else type(ids).__name__
        raise ConfigError(f"a prefix store serves one request at a time: pass ids of shape (T,) or (1, T), got {got}.")
    return ids.reshape(1, -1)


# --8<-- [start:copy]
def copy_cache(state: State, n: Optional[int] = None, start: Optional[int] = None) -> State:
    """A fresh state holding copies of the first n cached tokens (all by default) of every layer.

    start: relabel the copied tokens as positions start, start+1, ...: what pasting a cached span at another
    place in a new prompt would do. The keys keep whatever positions (RoPE) and context they were computed with.
    """
    out = []
    for layer in state:
        c = KVCache()
        src = layer["self"]
        if src.entries is not None:
            keep = len(src) if n is None else n
            if not 0 <= keep <= len(src):
                raise ConfigError(f"copy_cache: n={n} must lie in [0, {len(src)}] (the tokens cached).")
            if keep:
                c.entries = tuple(e[:, :, :keep].clone() for e in src.entries)  # (1, n_kv, keep, hs) each
                c.pos = src.pos[:, :keep].clone() if start is None else (start + torch.arange(keep))[None]
        out.append({"self": c, "cross": KVCache()})
    return out
# --8<-- [end:copy]


# --8<-- [start:store]
class PrefixStore:
    """Caches of earlier prompts, keyed by ALL their token ids from position 0.

    lookup(ids) finds the stored prompt sharing the longest common prefix with ids and returns (n, state): a copy
    of its cache cut to those n tokens. A key is the whole sequence from the start, never a span on its own: the
    keys and values of a token depend on every token before it (from the second layer on) and on its position,
    so only a common prefix at the same positions may be reused.
    """

    def __init__(self):
        self.entries: dict[tuple[int, ...], State] = {}  # token ids from position 0 -> the cache of exactly them

    def insert(self, ids: Tensor, state: State) -> None:
        key = tuple(int(t) for t in _one_row(ids)[0])
        layer0 = state[0]["self"]
        if len(layer0) != len(key) or (layer0.pos is not None and not torch.equal(layer0.pos[0], torch.arange(len(key)))):
            raise ConfigError(f"insert a cache of exactly these {len(key)} tokens at positions 0..{len(key) - 1}; "
                              f"got {len(layer0)} cached tokens: a prefix is stored from position 0 or not at all.")
        self.entries[key] = copy_cache(state)

    def lookup(self, ids: Tensor) -> tuple[int, Optional[State]]:
        """(n, state): the longest common prefix of ids with a stored prompt and a copy of its cache cut to those
        n tokens; (0, None) when no stored prompt starts with ids[0]."""
        query = [int(t) for t in _one_row(ids)[0]]
        best, best_key = 0, None
        for key in self.entries:
            n = 0
            for a, b in zip(key, query):
                if a != b:
                    break
                n += 1
            if n > best:
                best, best_key = n, key
        return (0, None) if best_key is None else (best, copy_cache(self.entries[best_key], best))
# --8<-- [end:store]


# --8<-- [start:chunked]
@torch.no_grad()
def chunked_prefill(model, ids: Tensor, chunk: int, state: Optional[State] = None) -> tuple[Tensor, State]:
    """Feed ids (B, T) to a DecoderLM `chunk` tokens at a time through one cache (after whatever `state` holds).

    Returns the (B, T, V) logits of every fed position and the cache. Each chunk's queries attend to the cached
    keys of all earlier chunks and, causally, to their own: the same keys and masks as one pass over ids.
    """
    if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1:
        raise ConfigError(f"chunk={chunk!r} must be a positive integer (tokens per prefill step; 1 = token by token).")
    state = model.decoder.new_cache() if state is None else state
    outs = [model(ids[:, i:i + chunk], cache=state) for i in range(0, ids.shape[1], chunk)]  # (B, ≤chunk, V) each
    return torch.cat(outs, dim=1), state
# --8<-- [end:chunked]


# --8<-- [start:serve]
@torch.no_grad()
def prefill_with_store(model, store: PrefixStore, ids: Tensor, chunk: Optional[int] = None) -> tuple[Tensor, State, int]:
    """Serve one prompt (1, T): reuse the longest cached prefix, prefill only the rest, store the whole prompt.

    Returns the logits of the positions computed (1, T - n, V), the cache of all T tokens, and n, the tokens
    reused. At least the last token is always fed, so there are logits to pick the next token from.
    """
    ids = _one_row(ids)
    n, state = store.lookup(ids)
    n = min(n, ids.shape[1] - 1)  # a prompt stored whole: recompute its last token for the next-token logits
    state = copy_cache(state, n) if n else model.decoder.new_cache()
    logits, state = chunked_prefill(model, ids[:, n:], chunk or ids.shape[1], state)
    store.insert(ids, state)
    return logits, state, n
# --8<-- [end:serve]
