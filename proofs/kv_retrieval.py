"""A key-value retrieval prompt for the KV-eviction page (docs/inference/kv-eviction.md).

The prompt lists n facts, each ONE token that fuses a key and its value ("key 3 has value 5"), then asks for one key;
the answer is read one step later, at a cue token that the decoder feeds as its first generated input:

    [fact_1 … fact_n  query_key] | [CUE] -> value of query_key
    <------- prompt (cached, may be evicted) ------->   <- first decode step: reads the (evicted) cache

Exactly one prompt token holds the answer, so a cache that evicts it has lost the answer for good. The targets train
the value at the query (so the question's attention points at its fact, as SnapKV's observation window assumes)
and at the cue (the answer the page measures); every other position is ignored (-100).

Token ids: 0 = CUE, 1..K = query keys, K+1..K+V = values (the answers), then K·V fact tokens.
"""

from __future__ import annotations

import torch
from torch import Tensor

from proofs.transformer.config import ConfigError

CUE = 0


def vocab_size(keys: int, values: int) -> int:
    return 1 + keys + values + keys * values


def check(keys: int, values: int, facts: int) -> None:
    if keys < 1 or values < 2 or not 1 <= facts <= keys:
        raise ConfigError(f"a retrieval prompt needs keys >= 1, values >= 2 and 1 <= facts <= keys (facts have distinct "
                          f"keys), got keys={keys}, values={values}, facts={facts}.")


def prompts(g: torch.Generator, batch: int, keys: int, values: int, facts: int) -> tuple[Tensor, Tensor, Tensor]:
    """(batch, facts + 1) prompts (facts, then the query key), (batch,) answer tokens, (batch,) index of the fact that
    holds the answer."""
    check(keys, values, facts)
    k = torch.rand(batch, keys, generator=g).argsort(-1)[:, :facts]  # (batch, facts) distinct keys
    v = torch.randint(0, values, (batch, facts), generator=g)  # (batch, facts) their values
    fact_tokens = 1 + keys + values + k * values + v  # (batch, facts)
    where = torch.randint(0, facts, (batch,), generator=g)  # (batch,) which fact is asked for
    rows = torch.arange(batch)
    query = 1 + k[rows, where]  # (batch,)
    answer = 1 + keys + v[rows, where]  # (batch,)
    return torch.cat([fact_tokens, query[:, None]], 1), answer, where


def training_batch(g: torch.Generator, batch: int, keys: int, values: int, facts: int) -> tuple[Tensor, Tensor]:
    """(batch, facts + 2) inputs (prompt + CUE) and targets: the answer at the query and at the cue, -100 elsewhere."""
    p, answer, _ = prompts(g, batch, keys, values, facts)
    x = torch.cat([p, p[:, -1:]], 1)  # the first decode input re-reads the query key
    y = torch.full_like(x, -100)
    y[:, -2], y[:, -1] = answer, answer
    return x, y
