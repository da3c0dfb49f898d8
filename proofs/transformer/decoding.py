"""Decoding: turning next-token logits into tokens.

Every decoder here takes `last_logits(ids, n_new) -> (B, V)`, a function that returns the logits of the
next token given the ids so far, where n_new counts the ids at the end that the model has not been fed
yet (so a cached model feeds only those). DecoderLM.generate and EncoderDecoder.generate build one.

    greedy          the argmax token, every step
    filter_logits   temperature, then top-k, then top-p (nucleus) on one step's logits
    sample          draw each token from the filtered distribution
    beam_search     keep the best `beams` partial sequences (optional eos and GNMT length normalisation)
"""

from __future__ import annotations

import math
from typing import NamedTuple, Optional

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


# --8<-- [start:filter]
def check_filters(temperature: float = 1.0, top_k: Optional[int] = None, top_p: Optional[float] = None) -> None:
    """Raise ConfigError on a value filter_logits cannot use, saying what is allowed."""
    if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not 0 < temperature < math.inf:
        raise ConfigError(f"temperature={temperature!r} must be a finite number > 0 (T -> 0 approaches greedy: "
                          f"call greedy() for T = 0; a negative T would reverse the ranking).")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1):
        raise ConfigError(f"top_k={top_k!r} must be a positive integer (the tokens kept), or None for no top-k.")
    if top_p is not None and (isinstance(top_p, bool) or not isinstance(top_p, (int, float)) or not 0 < top_p <= 1):
        raise ConfigError(f"top_p={top_p!r} must be in (0, 1] (the probability mass kept), or None for no top-p.")


def nucleus(probs: Tensor, p: float) -> Tensor:
    """(..., V) bool: the smallest set of most likely tokens whose probability adds up to at least p (Holtzman
    et al. 2020, §3.1). A token is in when the mass of the tokens more likely than it is still below p, so the
    token that crosses p is in, and so is the most likely token, whatever p. Ties are cut in sort order."""
    sorted_probs, order = probs.sort(dim=-1, descending=True)  # (..., V) each
    before = sorted_probs.cumsum(-1) - sorted_probs  # (..., V) mass strictly ahead of each token
    return torch.zeros_like(probs, dtype=torch.bool).scatter(-1, order, before < p)


def filter_logits(logits: Tensor, temperature: float = 1.0, top_k: Optional[int] = None,
                  top_p: Optional[float] = None) -> Tensor:
    """The logits (..., V) to sample from, in this order:

    1. temperature: divide by T (T < 1 sharpens, T > 1 flattens; the ranking never changes);
    2. top-k: keep the k largest (exactly k; ties at the k-th value are cut in topk's order; k >= V keeps all);
    3. top-p: keep the nucleus of softmax(step 2's logits), i.e. top-p reads the mass *after* temperature and
       *inside* the top k, renormalised (the order of Hugging Face's generate).

    Dropped tokens get -inf, so softmax of the result is the renormalised distribution over the kept ones.
    """
    check_filters(temperature, top_k, top_p)
    logits = logits / temperature
    if top_k is not None and top_k < logits.shape[-1]:
        kept = logits.topk(top_k, dim=-1).indices  # (..., k)
        keep = torch.zeros_like(logits, dtype=torch.bool).scatter(-1, kept, True)
        logits = logits.masked_fill(~keep, -math.inf)
    if top_p is not None and top_p < 1:  # p = 1 keeps everything (a float cumsum could drop a tiny tail)
        logits = logits.masked_fill(~nucleus(logits.softmax(-1), top_p), -math.inf)
    return logits
# --8<-- [end:filter]


# --8<-- [start:sample]
@torch.no_grad()
def sample(last_logits, ids: Tensor, steps: int, generator: Optional[torch.Generator] = None,
           **filters) -> tuple[Tensor, Tensor]:
    """Append `steps` tokens to ids (B, T), each drawn from softmax(filter_logits(logits, **filters)) with
    `generator` (seed it for a reproducible draw). filters: temperature, top_k, top_p. Same interface and
    returns as greedy: (B, T+steps) ids and the (B, steps, V) unfiltered logits each token was drawn from."""
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ConfigError(f"steps={steps!r} must be a positive integer: the number of tokens to generate.")
    check_filters(**filters)
    picked, n_new = [], ids.shape[1]
    for _ in range(steps):
        last = last_logits(ids, n_new)  # (B, V)
        probs = filter_logits(last, **filters).softmax(-1)  # (B, V), zero outside the kept tokens
        ids = torch.cat([ids, torch.multinomial(probs, 1, generator=generator)], dim=1)
        picked.append(last)
        n_new = 1
    return ids, torch.stack(picked, dim=1)
# --8<-- [end:sample]


class Beams(NamedTuple):
    """What beam_search returns, best hypothesis first (by the score it ranked with)."""

    ids: Tensor  # (B, beams, T+steps): prompt and continuation; after eos a hypothesis is padded with eos
    logprob: Tensor  # (B, beams): log P(continuation | prompt), up to and including eos; -inf: no such hypothesis
    length: Tensor  # (B, beams): continuation tokens, eos included, padding not


# --8<-- [start:beam]
def gnmt_lp(length: Tensor, alpha: float) -> Tensor:
    """GNMT's lp(Y) = (5 + |Y|)^alpha / (5 + 1)^alpha (Wu et al. 2016); alpha = 0 gives 1: no normalisation."""
    return ((5 + length) / 6) ** alpha


@torch.no_grad()
def beam_search(last_logits, ids: Tensor, steps: int, beams: int, *, eos: Optional[int] = None,
                length_penalty: float = 0.0, reorder=None) -> Beams:
    """Keep the `beams` best partial continuations of each prompt in ids (B, T) for `steps` steps.

    Each step extends every kept hypothesis by every token and keeps the `beams` candidates of highest
    score = log P / gnmt_lp(length, length_penalty). A hypothesis that has emitted `eos` is finished: it stays
    in the beam (competing for a slot) and only takes eos padding at log-prob 0 and length unchanged.

    The model's state: last_logits(ids, n_new) is the greedy interface, called on (B*H, L) ids, one row per
    hypothesis. With reorder=None every step re-feeds every hypothesis whole (n_new = L: for a last_logits
    without a cache). With reorder(rows), a cached model is told after each step which row each new
    hypothesis continues (rows: (B*H',) indices into the previous rows, repeats allowed) and is fed only
    the new token; lm_beam_fns(model) builds both for a DecoderLM, reordering its KVCache rows.
    """
    if isinstance(beams, bool) or not isinstance(beams, int) or beams < 1:
        raise ConfigError(f"beams={beams!r} must be a positive integer (beams=1 is greedy).")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ConfigError(f"steps={steps!r} must be a positive integer: the number of tokens to generate.")
    if isinstance(length_penalty, bool) or not isinstance(length_penalty, (int, float)) or not length_penalty >= 0:
        raise ConfigError(f"length_penalty={length_penalty!r} must be a number >= 0: GNMT's exponent alpha "
                          f"(0: rank by plain log-probability, 1: by log-probability per token, roughly).")
    B, T = ids.shape
    seqs = ids[:, None]  # (B, H, L): H = 1 hypothesis per prompt to start with
    logp = ids.new_zeros(B, 1, dtype=torch.float)  # (B, H) log P of each hypothesis
    length = torch.zeros_like(ids[:, :1])  # (B, H) continuation tokens so far
    done = torch.zeros_like(ids[:, :1], dtype=torch.bool)  # (B, H) emitted eos
    n_new = T
    for _ in range(steps):
        H, L = seqs.shape[1], seqs.shape[2]
        step = last_logits(seqs.reshape(B * H, L), n_new).log_softmax(-1).view(B, H, -1).float()  # (B, H, V)
        V = step.shape[-1]
        if eos is not None and not 0 <= eos < V:
            raise ConfigError(f"eos={eos!r} is not a token of this vocabulary (0..{V - 1}); pass its id, or None.")
        if eos is not None:  # a finished hypothesis may only be padded, for free
            pad = torch.full_like(step, -math.inf)
            pad[..., eos] = 0.0
            step = torch.where(done[..., None], pad, step)
        cand_logp = logp[..., None] + step  # (B, H, V)
        cand_len = (length + ~done)[..., None].expand(B, H, V)  # (B, H, V) finished ones do not grow
        score = cand_logp / gnmt_lp(cand_len, length_penalty)
        top = score.reshape(B, H * V).topk(min(beams, H * V), dim=-1).indices  # (B, H') best first
        parent, token = top // V, top % V  # (B, H') which hypothesis each continues, with which token
        seqs = torch.cat([seqs.gather(1, parent[..., None].expand(-1, -1, L)), token[..., None]], dim=2)
        logp = cand_logp.reshape(B, H * V).gather(1, top)
        length = cand_len.reshape(B, H * V).gather(1, top)
        done = done.gather(1, parent) | (token == eos) if eos is not None else done.gather(1, parent)  # (B, H')
        if reorder is not None:
            reorder((parent + H * torch.arange(B, device=ids.device)[:, None]).reshape(-1))  # (B*H',) old rows
            n_new = 1
        else:
            n_new = seqs.shape[2]
    return Beams(seqs, logp, length)
# --8<-- [end:beam]


# --8<-- [start:lm_beam_fns]
def lm_beam_fns(model, use_cache: bool = True):
    """last_logits and reorder for beam search over a DecoderLM. With the cache, each step feeds only the
    newest token of each hypothesis, and reorder makes row r of every layer's cache a copy of old row rows[r]
    (KVCache.reorder: index_select, so the whole cache is copied once per step; the cache holds one row per
    hypothesis: beams times a single sequence's bytes). Without the cache reorder is None (re-feed)."""
    cache = model.decoder.new_cache() if use_cache else None

    def last_logits(ids: Tensor, n_new: int) -> Tensor:
        if cache is None:
            return model(ids)[:, -1]  # (B*H, V): every position recomputed
        return model(ids[:, ids.shape[1] - n_new:], cache=cache)[:, -1]

    def reorder(rows: Tensor) -> None:
        for layer in cache:
            layer["self"].reorder(rows)

    return last_logits, (reorder if cache is not None else None), cache  # the cache, to count its bytes
# --8<-- [end:lm_beam_fns]
