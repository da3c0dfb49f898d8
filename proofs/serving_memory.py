"""Serving memory: the three terms (weights, key/value cache, one decode step's activations) and what fits.

Used by proofs/inference/proof_serving_memory.py. Plain arithmetic (the instrument it uses, TransientBytes, is in proofs/measure.py):

    weight_bytes(params, bytes_per)          parameters × bytes per parameter
    int8_weight_bytes(model)                 bytes of a weight-only int8 copy (codes + per-row scales; the rest in float)
    kv_bytes_per_token(L, n_kv, d_head, b)   2 · L · n_kv · d_head · bytes: one key and one value per layer and KV head
    kv_bytes(shape, tokens, batch, bytes)    per token × cached tokens (capped by a sliding window) × batch
    largest_batch(capacity, weights, ...)    the most sequences of a given context whose cache fits beside the weights
    crossover_tokens(weights, per_token)     batch × cached tokens at which the cache weighs as much as the weights

Units are bytes; GB = 1e9 bytes, GiB = 2**30 bytes (both spelled out where a figure is printed).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from torch import nn

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
