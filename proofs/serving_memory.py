"""Serving memory: the three terms (weights, key/value cache, one decode step's activations) and what fits.

Used by proofs/inference/proof_serving_memory.py. Plain arithmetic plus one instrument:

    weight_bytes(params, bytes_per)          parameters × bytes per parameter
    int8_weight_bytes(model)                 bytes of a weight-only int8 copy (codes + per-row scales; the rest in float)
    kv_bytes_per_token(L, n_kv, d_head, b)   2 · L · n_kv · d_head · bytes: one key and one value per layer and KV head
    kv_bytes(shape, tokens, batch, bytes)    per token × cached tokens (capped by a sliding window) × batch
    largest_batch(capacity, weights, ...)    the most sequences of a given context whose cache fits beside the weights
    crossover_tokens(weights, per_token)     batch × cached tokens at which the cache weighs as much as the weights
    TransientBytes                           peak bytes of the tensors one forward call creates and frees again

Units are bytes; GB = 1e9 bytes, GiB = 2**30 bytes (both spelled out where a figure is printed).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Optional

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from proofs.transformer.config import ConfigError
from proofs.transformer.quant import quantise

GB, GiB, MiB, KiB = 10**9, 2**30, 2**20, 2**10


# --8<-- [start:formulas]
@dataclass(frozen=True)
class CacheShape:
    """What sets the cache: layers, key/value heads, head width, and a sliding window (None: every token)."""
    layers: int
    n_kv: int
    d_head: int
    window: Optional[int] = None


def weight_bytes(params: int, bytes_per: float) -> float:
    """Parameters × bytes per parameter (4 fp32, 2 bf16/fp16, 1 int8 before its scales)."""
    return params * bytes_per


def kv_bytes_per_token(shape: CacheShape, bytes_per: int) -> int:
    """2 (key and value) · layers · n_kv · d_head · bytes, for one token of one sequence."""
    return 2 * shape.layers * shape.n_kv * shape.d_head * bytes_per


def kv_bytes(shape: CacheShape, tokens: int, batch: int, bytes_per: int) -> int:
    """The cache of `batch` sequences of `tokens` tokens; a sliding window of w keeps at most w tokens per layer."""
    kept = tokens if shape.window is None else min(tokens, shape.window)
    return kv_bytes_per_token(shape, bytes_per) * kept * batch


def largest_batch(capacity: float, weights: float, shape: CacheShape, context: int, bytes_per: int,
                  reserve: float = 0.0) -> int:
    """The most sequences of `context` tokens whose cache fits in capacity − weights − reserve (0 if the weights
    alone do not fit). An upper bound: activations, the allocator and the runtime take some of `reserve`."""
    if context < 1:
        raise ConfigError(f"context must be at least 1 token, got {context}.")
    free = capacity - weights - reserve
    return max(0, int(free // kv_bytes(shape, context, 1, bytes_per)))


def crossover_tokens(weights: float, per_token: int) -> float:
    """Cached tokens (summed over the batch) at which the cache weighs as much as the weights."""
    return weights / per_token
# --8<-- [end:formulas]


# --8<-- [start:int8]
def int8_weight_bytes(model: nn.Module) -> dict:
    """Bytes of weight-only int8 storage: every nn.Linear weight as int8 codes plus one fp32 scale per output row
    (proofs.transformer.quant.quantise, per_channel); every other parameter (embeddings, norms, biases) left as is."""
    linear = [m.weight for m in model.modules() if isinstance(m, nn.Linear)]
    quantised = [quantise(w.detach().float(), 8, "per_channel") for w in linear]
    ids = {id(w) for w in linear}
    rest = sum(p.nbytes for p in model.parameters() if id(p) not in ids)
    codes, scales = sum(q.codes.nbytes for q in quantised), sum(q.scale.nbytes for q in quantised)
    return {"codes": codes, "scales": scales, "rest": rest, "total": codes + scales + rest,
            "linear_params": sum(w.numel() for w in linear), "linear_rows": sum(w.shape[0] for w in linear)}
# --8<-- [end:int8]


# --8<-- [start:transient]
class TransientBytes(TorchDispatchMode):
    """Peak bytes, over one block, of the tensors the block's operators create and that are gone by its end.

        with TransientBytes() as watch:
            lm(next_token, cache=cache)
        watch.peak   # the activations of that call: logits and the new cache entries (which survive) not counted

    Every operator output whose storage is new (not a view of, or written into, an input) is logged at creation and
    at its release (a weakref finalizer). Outputs still alive when the block ends are survivors: what the step
    leaves behind (new cache entries, logits). The peak is taken over the others only.

    `released`: tensors that existed before the block (e.g. the old cache entries) whose release inside it is logged
    too (they must have no other views). `net_peak` is then the peak of everything the block allocated, survivors
    included, minus what of `released` it had freed by then: the memory the step needs above what it started with.
    A cache that appends by torch.cat allocates a new copy of a layer's entries before dropping the old one; that
    overlap shows in `net_peak`, not in `peak`.
    """

    def __init__(self, released=()):
        super().__init__()
        self.events: list[tuple[int, int, int]] = []  # (time, +bytes | -bytes, key)
        self.alive: dict[int, int] = {}  # key -> bytes, for outputs not yet freed
        self.clock = 0
        self.peak = 0
        self.net_peak = 0
        self.survivors = 0
        self.pre: set[int] = set()  # keys of the `released` tensors
        for t in released:  # no strong reference kept: the finalizer fires when the caller's last one goes
            self.clock += 1
            self.pre.add(self.clock)
            weakref.finalize(t, self._free, self.clock, t.untyped_storage().nbytes())

    def _free(self, key: int, nbytes: int) -> None:
        self.clock += 1
        self.events.append((self.clock, -nbytes, key))
        self.alive.pop(key, None)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {a.untyped_storage().data_ptr() for a in torch.utils._pytree.tree_leaves((args, kwargs))
                  if isinstance(a, torch.Tensor)}
        for t in torch.utils._pytree.tree_leaves(out):
            if not isinstance(t, torch.Tensor) or t.untyped_storage().data_ptr() in inputs or t._base is not None:
                continue
            self.clock += 1
            nbytes, key = t.untyped_storage().nbytes(), self.clock  # a fresh key (ids of freed tensors are reused)
            self.events.append((self.clock, nbytes, key))
            self.alive[key] = nbytes
            weakref.finalize(t, self._free, key, nbytes)
        return out

    def __exit__(self, *exc):
        result = super().__exit__(*exc)
        surviving = set(self.alive) - self.pre  # created in the block, still referenced after it
        self.survivors = sum(self.alive[k] for k in surviving)
        live = net = 0
        for _, delta, key in sorted(self.events):
            net += delta  # everything: block outputs (survivors too) and the released tensors' frees
            self.net_peak = max(self.net_peak, net)
            if key in surviving or key in self.pre:
                continue
            live += delta
            self.peak = max(self.peak, live)
        return result
# --8<-- [end:transient]
