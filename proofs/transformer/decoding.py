"""Decoding: turning next-token logits into tokens.

Every decoder here takes `last_logits(ids, n_new) -> (B, V)`, a function that returns the logits of the
next token given the ids so far, where n_new counts the ids at the end that the model has not been fed
yet (so a cached model feeds only those). DecoderLM.generate and EncoderDecoder.generate build one.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .config import ConfigError


# --8<-- [start:greedy]
@torch.no_grad()
def greedy(last_logits, ids: Tensor, steps: int) -> tuple[Tensor, Tensor]:
    """Append `steps` argmax tokens to ids (B, T). last_logits(ids, n_new) returns the (B, V) logits of the
    next token, where n_new counts the tokens at the end of ids that the model has not been fed yet."""
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ConfigError(f"steps={steps!r} must be a positive integer: the number of tokens to generate.")
    picked, n_new = [], ids.shape[1]
    for _ in range(steps):
        last = last_logits(ids, n_new)  # (B, V)
        ids = torch.cat([ids, last.argmax(-1, keepdim=True)], dim=1)  # feed the choice back
        picked.append(last)
        n_new = 1
    return ids, torch.stack(picked, dim=1)
# --8<-- [end:greedy]
