"""Serving many requests with one model: iteration-level scheduling (Orca, Yu et al. 2022) over a paged
key/value cache (vLLM, Kwon et al. 2023).

    Request         a prompt and the number of tokens to generate for it
    serve           runs requests through `slots` batch rows, one token per active row per model call (prompt
                    tokens too); refill="continuous" gives a finished row's slot to the next waiting request
                    at once, refill="static" waits until every row of the batch is done (request-level batching)
    generate_alone  one request by itself with the plain contiguous cache: the reference

Greedy decoding throughout. Each row of the paged cache is a slot: `PagedKVCache.use_rows` makes a model call
serve only the active slots, each at its own length, and `free_row` returns a finished request's blocks.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import torch
from torch import Tensor

from .config import ConfigError

REFILLS = ("continuous", "static")


@dataclass
class Request:
    prompt: Tensor  # (T0,) token ids, T0 >= 1
    max_new: int  # tokens to generate


@dataclass
class ServeStats:
    steps: int = 0  # model calls (iterations); each feeds one token to every active slot
    busy: int = 0  # slot-steps that fed a request's token
    idle: int = 0  # slot-steps with no request while the engine ran: steps * slots - busy
    wasted_slots: list[int] = field(default_factory=list)  # per step: allocated cache slots holding no token (one layer)
    stored: list[int] = field(default_factory=list)  # per step: tokens held in the cache (one layer)
    active_rows: list[int] = field(default_factory=list)  # per step: requests being served
    finish_step: list[int] = field(default_factory=list)  # per request: the step after which it was complete
    logits: list[list[Tensor]] = field(default_factory=list)  # per request, with keep_logits: each new token's logits


def _check(requests: list, slots: int, refill: str, vocab: int) -> None:
    if isinstance(slots, bool) or not isinstance(slots, int) or slots < 1:
        raise ConfigError(f"slots={slots!r} must be a positive integer: the batch rows the engine runs at once.")
    if refill not in REFILLS:
        raise ConfigError(f"refill={refill!r} is not one of {REFILLS}.")
    for i, r in enumerate(requests):
        if not isinstance(r.prompt, Tensor) or r.prompt.dim() != 1 or r.prompt.numel() < 1:
            raise ConfigError(f"request {i}: prompt must be a 1-d tensor of at least one token id.")
        if int(r.prompt.min()) < 0 or int(r.prompt.max()) >= vocab:
            raise ConfigError(f"request {i}: token ids must lie in [0, {vocab}).")
        if isinstance(r.max_new, bool) or not isinstance(r.max_new, int) or r.max_new < 1:
            raise ConfigError(f"request {i}: max_new={r.max_new!r} must be a positive integer.")


# --8<-- [start:serve]
@torch.no_grad()
def serve(model, requests: list[Request], slots: int, refill: str = "continuous", block_size: int = 16,
          n_blocks: int | None = None, keep_logits: bool = False) -> tuple[list[Tensor], ServeStats]:
    """Greedy generation for every request, `slots` at a time (call model.eval() first). Returns each request's
    generated tokens (max_new,) in request order, and the counters (with keep_logits, the logits they came from)."""
    _check(requests, slots, refill, model.cfg.vocab_size)
    if n_blocks is None:  # enough blocks that no request ever waits for memory
        longest = max(r.prompt.numel() + r.max_new for r in requests)
        n_blocks = slots * -(-longest // max(block_size, 1))
    cache = model.decoder.new_cache("paged", batch=slots, n_blocks=n_blocks, block_size=block_size)
    waiting = deque(range(len(requests)))
    held: list[int | None] = [None] * slots  # the request each slot serves
    fed = [0] * slots  # tokens of its request the slot has fed so far
    out: list[list[int]] = [[] for _ in requests]
    stats = ServeStats(finish_step=[-1] * len(requests), logits=[[] for _ in requests])
    while waiting or any(h is not None for h in held):
        if refill == "continuous" or all(h is None for h in held):  # static: a new batch only when all are done
            for s in range(slots):
                if held[s] is None and waiting:
                    held[s], fed[s] = waiting.popleft(), 0
        active = [s for s in range(slots) if held[s] is not None]
        tokens = []
        for s in active:  # the next token to feed: a prompt token, or the last generated one
            r = requests[held[s]]
            n0 = r.prompt.numel()
            tokens.append(int(r.prompt[fed[s]]) if fed[s] < n0 else out[held[s]][fed[s] - n0])
        for layer in cache:
            layer["self"].use_rows(active)
        logits = model(torch.tensor(tokens)[:, None], cache=cache)[:, -1]  # (A, V), each row at its own position
        stats.steps += 1
        stats.busy += len(active)
        stats.active_rows.append(len(active))
        stats.wasted_slots.append(cache[0]["self"].wasted_slots)
        stats.stored.append(sum(cache[0]["self"].lengths))
        for row, s in enumerate(active):
            req = held[s]
            fed[s] += 1
            if fed[s] < requests[req].prompt.numel():
                continue  # still reading the prompt: this call's prediction is not a new token
            out[req].append(int(logits[row].argmax()))
            if keep_logits:
                stats.logits[req].append(logits[row])
            if len(out[req]) == requests[req].max_new:  # done: its blocks go back to the pool
                for layer in cache:
                    layer["self"].free_row(s)
                held[s] = None
                stats.finish_step[req] = stats.steps
    stats.idle = stats.steps * slots - stats.busy
    return [torch.tensor(o) for o in out], stats
# --8<-- [end:serve]


@torch.no_grad()
def generate_alone(model, request: Request) -> tuple[Tensor, Tensor]:
    """The request by itself: prompt in one call, then one token per call, contiguous KVCache.
    Returns its (max_new,) tokens and the (max_new, V) logits they were picked from."""
    ids, logits = model.generate(request.prompt[None], request.max_new)
    return ids[0, request.prompt.numel():], logits[0]
