"""Speculative decoding (Leviathan et al. 2023; Chen et al. 2023): a small draft model proposes k tokens, the
target model scores all of them in one call, and a rejection rule keeps a prefix of them plus one token of its own.

    check_pair            the draft must share the target's vocabulary (ConfigError naming the fix otherwise)
    verify                the rule: how many drafted tokens to keep, and the token that follows them
    speculative_generate  greedy or sampled, a batch of independent rows, both caches rolled back after rejections
    target_generate       the target alone, one call per token: the reference

Notation of Leviathan et al.: p is the target's next-token distribution, q the draft's. The "exact" rule keeps a
drafted token x with probability min(1, p(x)/q(x)) and, at the first rejection, draws the replacement from
(p - q)+ renormalised; every emitted token is then distributed as p. The "argmax" rule (keep x when it is the
target's argmax, else draw from p) is the folk answer: right for greedy decoding, biased for sampling.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torch import Tensor

from .config import ConfigError

RULES = ("exact", "argmax")


@dataclass
class SpecStats:
    """Counters of one speculative_generate call (rows that already have their tokens are not counted)."""

    target_calls: int = 0  # forward calls of the target (each scores k+1 positions per row)
    draft_calls: int = 0  # forward calls of the draft (k+1 per round: k proposals and one to cache the last)
    rounds: int = 0
    row_rounds: int = 0  # rounds summed over the rows still generating: target passes each row needed
    proposed: int = 0  # drafted tokens, summed over the rows still generating
    accepted: int = 0  # of which kept
    full_rows: int = 0  # row-rounds that kept all k proposals (no rejection)

    @property
    def acceptance_rate(self) -> float:
        """Kept proposals / proposals."""
        return self.accepted / max(self.proposed, 1)

    @property
    def alpha(self) -> float:
        """Leviathan et al.'s alpha estimated: P(a proposal is kept | the ones before it were) = kept / judged,
        where the judged proposals are the kept ones plus one rejection per round that had one."""
        return self.accepted / max(self.accepted + self.row_rounds - self.full_rows, 1)


def check_pair(target, draft) -> None:
    """A draft proposes token ids that the target scores: both must use one vocabulary (one tokenizer)."""
    vt, vd = target.cfg.vocab_size, draft.cfg.vocab_size
    if vt != vd:
        raise ConfigError(
            f"the draft's vocabulary ({vd} tokens) differs from the target's ({vt}): drafted ids would mean other "
            f"tokens to the target. Build the draft with vocab_size={vt} and the target's tokenizer."
        )


def _check_args(prompt: Tensor, steps: int, k: int = 1, rule: str = "exact", temperature: float = 1.0) -> None:
    if not isinstance(prompt, Tensor) or prompt.dim() != 2 or prompt.shape[1] < 1:
        raise ConfigError(f"prompt must be (batch, time >= 1) token ids, got {getattr(prompt, 'shape', prompt)}.")
    for name, v in (("steps", steps), ("k", k)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ConfigError(f"{name}={v!r} must be a positive integer ({'tokens to generate' if name == 'steps' else 'draft tokens per round'}).")
    if rule not in RULES:
        raise ConfigError(f"rule={rule!r} is not one of {RULES}.")
    if not temperature > 0:
        raise ConfigError(f"temperature={temperature} must be > 0 (use sample=False for greedy decoding).")


# --8<-- [start:verify]
def verify(p: Tensor, q: Tensor, drafted: Tensor, generator: Optional[torch.Generator] = None,
           rule: str = "exact", greedy: bool = False) -> tuple[Tensor, Tensor]:
    """p (B, k+1, V): the target's distributions at the k drafted positions and the one after them;
    q (B, k, V): the draft's distributions the tokens drafted (B, k) were drawn from.
    Returns n (B,), how many drafted tokens each row keeps, and next (B,), the token that follows them."""
    B, k = drafted.shape
    rows = torch.arange(B)
    if greedy:  # greedy: keep drafted tokens while they are the target's argmax; then the target's argmax
        n = (drafted == p[:, :k].argmax(-1)).long().cumprod(1).sum(1)  # (B,) length of the agreeing prefix
        return n, p[rows, n].argmax(-1)
    p_x = p[:, :k].gather(-1, drafted[..., None])[..., 0]  # (B, k) p(x_i) of the drafted tokens
    q_x = q.gather(-1, drafted[..., None])[..., 0]  # (B, k) q(x_i) > 0: x_i was drawn from q
    if rule == "exact":
        u = torch.rand(B, k, generator=generator)
        keep = u < (p_x / q_x).clamp(max=1.0)  # accept with probability min(1, p/q)
    else:  # the folk rule: accept when the target's argmax agrees
        keep = drafted == p[:, :k].argmax(-1)
    n = keep.long().cumprod(1).sum(1)  # (B,) tokens before the first rejection
    after = p[rows, n]  # (B, V) the target's distribution where the first rejection happened (or after all k)
    if rule == "exact":
        residual = (after - q[rows, n.clamp(max=k - 1)]).clamp(min=0)  # (p - q)+ at a rejected position
        mass = residual.sum(-1, keepdim=True)
        rejected = (n < k)[:, None] & (mass > 0)  # mass = 0 only if p = q there, when rejection has probability 0
        after = torch.where(rejected, residual / mass.clamp(min=1e-30), after)
    return n, torch.multinomial(after, 1, generator=generator)[:, 0]
# --8<-- [end:verify]


def _next_dist(logits: Tensor, sample: bool, temperature: float) -> Tensor:
    """(..., V) logits -> the distribution a token is drawn from: softmax(logits / T), or one-hot argmax."""
    if sample:
        return torch.softmax(logits.float() / temperature, dim=-1)
    return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).float()


def _rollback(cache: list, lengths: Tensor) -> None:
    for layer in cache:
        layer["self"].truncate(lengths)


# --8<-- [start:generate]
@torch.no_grad()
def speculative_generate(target, draft, prompt: Tensor, steps: int, k: int = 4, *, sample: bool = False,
                         temperature: float = 1.0, generator: Optional[torch.Generator] = None, rule: str = "exact",
                         caches: Optional[tuple[list, list]] = None) -> tuple[Tensor, SpecStats]:
    """Continue each row of prompt (B, T0) by `steps` tokens (call .eval() on both models first).

    Each round: the draft proposes k tokens one call at a time (plus one call that caches the last), the target
    scores the pending token and the k proposals in one call, `verify` keeps n of them and adds one token; both
    key/value caches are cut back (KVCache.truncate) to the kept tokens. Rows advance by different amounts: each
    keeps its own length, its tokens are fed at their own positions. Returns (B, T0+steps) ids and counters.
    caches: (target cache, draft cache) to use instead of fresh ones from each model's Decoder.new_cache().
    """
    check_pair(target, draft)
    _check_args(prompt, steps, k, rule, temperature)
    B, T0 = prompt.shape
    t_cache, d_cache = caches if caches is not None else (target.decoder.new_cache(), draft.decoder.new_cache())
    out = torch.zeros(B, T0 + steps + k + 1, dtype=torch.long, device=prompt.device)
    out[:, :T0] = prompt
    n = torch.full((B,), T0, dtype=torch.long)  # tokens of each row so far
    pending, cached = prompt, torch.zeros(B, dtype=torch.long)  # not yet fed to either model; entries cached
    stats, offsets = SpecStats(), torch.arange(k + 1)
    while bool((n - T0 < steps).any()):
        running = n - T0 < steps
        start = cached[:, None] + torch.arange(pending.shape[1])[None]  # (B, P) positions of the pending tokens
        feed, pos, qs, drafted = pending, start, [], []
        for i in range(k + 1):  # k proposals, then one call that puts the k-th proposal into the draft's cache
            logits = draft(feed, cache=d_cache, positions=pos)[:, -1]  # (B, V)
            stats.draft_calls += 1
            if i == k:
                break
            q = _next_dist(logits, sample, temperature)
            x = torch.multinomial(q, 1, generator=generator)[:, 0] if sample else q.argmax(-1)
            qs.append(q), drafted.append(x)
            feed, pos = x[:, None], pos[:, -1:] + 1
        drafted_t = torch.stack(drafted, 1)  # (B, k)
        scored = torch.cat([pending, drafted_t], 1)  # (B, P+k)
        p_logits = target(scored, cache=t_cache, positions=torch.cat([start, start[:, -1:] + 1 + offsets[:k]], 1))
        stats.target_calls += 1
        p = _next_dist(p_logits[:, -(k + 1):], sample, temperature)  # (B, k+1, V)
        kept, nxt = verify(p, torch.stack(qs, 1), drafted_t, generator, rule, greedy=not sample)
        # write the kept proposals and the new token at each row's own place (rows already done: nothing)
        new = torch.cat([drafted_t, drafted_t[:, :1]], 1).scatter(1, kept[:, None], nxt[:, None])  # (B, k+1)
        idx = (n[:, None] + offsets).clamp(max=out.shape[1] - 1)  # (B, k+1)
        write = (offsets <= kept[:, None]) & running[:, None]
        out.scatter_(1, idx, torch.where(write, new, out.gather(1, idx)))
        # the pending tokens and the kept proposals stay cached, the rest is rolled back (done rows: all of this round)
        cached = torch.where(running, n + kept, cached)
        _rollback(t_cache, cached)
        _rollback(d_cache, cached)
        pending = torch.where(running, nxt, pending[:, -1])[:, None]
        n = torch.where(running, n + kept + 1, n)
        stats.rounds += 1
        stats.row_rounds += int(running.sum())
        stats.proposed += k * int(running.sum())
        stats.accepted += int(kept[running].sum())
        stats.full_rows += int((kept[running] == k).sum())
    return out[:, :T0 + steps], stats
# --8<-- [end:generate]


@torch.no_grad()
def target_generate(target, prompt: Tensor, steps: int, *, sample: bool = False, temperature: float = 1.0,
                    generator: Optional[torch.Generator] = None) -> tuple[Tensor, int]:
    """The target alone with its key/value cache: one call per new token. Returns (B, T0+steps) ids and the calls."""
    _check_args(prompt, steps, temperature=temperature)
    cache, ids, feed = target.decoder.new_cache(), prompt, prompt
    for _ in range(steps):
        logits = target(feed, cache=cache)[:, -1]
        q = _next_dist(logits, sample, temperature)
        feed = (torch.multinomial(q, 1, generator=generator) if sample else q.argmax(-1, keepdim=True))
        ids = torch.cat([ids, feed], 1)
    return ids, steps
