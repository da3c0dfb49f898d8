"""Repetition controls: logits processors that look at the ids generated so far.

Each processor maps (logits (B, V), ids (B, T)) -> logits (B, V): the next token's logits given the ids so far
(prompt included, as Hugging Face's processors do). `with_processors` wraps the `last_logits(ids, n_new)` function
that greedy(), sample() and beam_search() take, so no decoding loop is copied.

    repetition_penalty        CTRL-style (Keskar et al. 2019) done right: a seen token's positive logit is
                              divided by theta, its negative logit multiplied by theta (theta > 1 penalises both)
    naive_repetition_penalty  the folk version, every seen logit divided by theta: a negative logit moves UP
    frequency_presence_penalty  OpenAI-style, subtractive: logit - frequency * count - presence * [count > 0]
    no_repeat_ngram           ban (-inf) every token that would complete an n-gram already in the ids
"""

from __future__ import annotations

import math
from typing import Callable

import torch
from torch import Tensor

Processor = Callable[[Tensor, Tensor], Tensor]  # (logits (B, V), ids (B, T)) -> logits (B, V)


def _check(logits: Tensor, ids: Tensor) -> None:
    if logits.dim() != 2 or ids.dim() != 2:
        raise ValueError(f"logits must be (B, V) and ids (B, T); got {tuple(logits.shape)} and {tuple(ids.shape)}: "
                         f"pass one step's logits (e.g. model(ids)[:, -1]) and the 2-D ids.")
    if logits.shape[0] != ids.shape[0]:
        raise ValueError(f"batch sizes differ: logits has {logits.shape[0]} rows and ids {ids.shape[0]}; "
                         f"pass the ids the logits were computed from.")
    if ids.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"ids must be integer token ids, got dtype {ids.dtype}.")
    if ids.numel() and not (0 <= int(ids.min()) and int(ids.max()) < logits.shape[1]):
        raise ValueError(f"ids must lie in 0..{logits.shape[1] - 1} (the vocabulary of the logits); got "
                         f"{int(ids.min())}..{int(ids.max())}.")


def _check_theta(theta: float) -> None:
    if isinstance(theta, bool) or not isinstance(theta, (int, float)) or not 0 < theta < math.inf:
        raise ValueError(f"theta={theta!r} must be a finite number > 0 (1 = no penalty, > 1 penalises repeats, "
                         f"CTRL uses 1.2; theta <= 0 would flip or zero the logits).")


def seen(ids: Tensor, vocab: int) -> Tensor:
    """(B, V) bool: which tokens occur anywhere in each row of ids (B, T)."""
    return torch.zeros(ids.shape[0], vocab, dtype=torch.bool, device=ids.device).scatter(1, ids.long(), True)


# --8<-- [start:penalty]
def repetition_penalty(logits: Tensor, ids: Tensor, theta: float) -> Tensor:
    """CTRL's penalty as libraries implement it: for every token already in ids, a positive logit is divided by
    theta and a negative one multiplied by theta, so for theta > 1 the token always loses probability mass
    relative to unseen tokens (its logit moves towards -inf either way). Unseen tokens are untouched."""
    _check(logits, ids)
    _check_theta(theta)
    penalised = torch.where(logits > 0, logits / theta, logits * theta)  # (B, V)
    return torch.where(seen(ids, logits.shape[1]), penalised, logits)


def naive_repetition_penalty(logits: Tensor, ids: Tensor, theta: float) -> Tensor:
    """The folk reading of "divide the logit by theta", reproduced to show it is wrong: a negative logit divided by
    theta > 1 moves towards 0, i.e. UP, so an unlikely token that was already generated becomes MORE likely."""
    _check(logits, ids)
    _check_theta(theta)
    return torch.where(seen(ids, logits.shape[1]), logits / theta, logits)
# --8<-- [end:penalty]


# --8<-- [start:frequency]
def frequency_presence_penalty(logits: Tensor, ids: Tensor, frequency: float = 0.0, presence: float = 0.0) -> Tensor:
    """OpenAI-style subtractive penalties: logit - frequency * count(token in ids) - presence * [count > 0].
    Frequency grows with every repeat; presence is paid once. Both shift a logit by the same amount whatever its
    sign, so there is no sign bug to make. Negative values encourage repeats."""
    _check(logits, ids)
    for name, v in (("frequency", frequency), ("presence", presence)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise ValueError(f"{name}={v!r} must be a finite number (0 = off; OpenAI allows -2..2).")
    counts = torch.zeros_like(logits).scatter_add(1, ids.long(), torch.ones_like(ids, dtype=logits.dtype))  # (B, V)
    return logits - frequency * counts - presence * (counts > 0).to(logits.dtype)
# --8<-- [end:frequency]


# --8<-- [start:ngram]
def banned_by_ngram(ids: Tensor, n: int, vocab: int) -> Tensor:
    """(B, V) bool: the tokens that would complete an n-gram already present in each row of ids (B, T), i.e. that
    follow an earlier occurrence of the row's last n-1 tokens. n = 1 bans every token already present."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n={n!r} must be a positive integer: the length of the n-grams that may not repeat.")
    B, T = ids.shape
    banned = torch.zeros(B, vocab, dtype=torch.bool, device=ids.device)
    if T < n:  # no complete n-gram yet (n - 1 context tokens plus one earlier follower are needed)
        return banned
    grams = ids.unfold(1, n, 1)  # (B, T-n+1, n): every n-gram in the row
    prefix = ids[:, T - n + 1:]  # (B, n-1): the context the next token would complete
    match = (grams[:, :, :n - 1] == prefix[:, None, :]).all(-1)  # (B, T-n+1): n-grams that start with the prefix
    rows, cols = match.nonzero(as_tuple=True)
    banned[rows, grams[rows, cols, n - 1]] = True
    return banned


def no_repeat_ngram(logits: Tensor, ids: Tensor, n: int) -> Tensor:
    """Hugging Face's no_repeat_ngram_size: -inf for every token that would repeat an n-gram of ids."""
    _check(logits, ids)
    return logits.masked_fill(banned_by_ngram(ids, n, logits.shape[1]), -math.inf)
# --8<-- [end:ngram]


# --8<-- [start:plug]
def with_processors(last_logits, *processors: Processor):
    """Wrap a decoder's next-token function last_logits(ids, n_new) -> (B, V) so that each processor, in order,
    rewrites the logits given all the ids so far. Use it with greedy(), sample() or beam_search() unchanged:
        greedy(with_processors(fn, lambda z, ids: repetition_penalty(z, ids, 1.2)), prompts, steps)
    The decoders then return the processed logits as the ones each token was picked from."""
    if not processors:
        raise ValueError("with_processors needs at least one processor (logits, ids) -> logits.")

    def processed(ids: Tensor, n_new: int) -> Tensor:
        z = last_logits(ids, n_new)  # (B, V)
        for p in processors:
            z = p(z, ids)
        return z

    return processed
# --8<-- [end:plug]
