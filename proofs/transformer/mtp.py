"""Multi-token prediction (MTP): one extra module on a built DecoderLM that predicts the token after next, its
training loss, and the draft that lets the existing speculative decoder (speculative.py) use it unchanged.

    MTPModule     DeepSeek-V3's sequential MTP module (§2.2), depth 1, with a feed-forward block in place of its
                  Transformer block: h' = M [RMSNorm(h_t); RMSNorm(Emb(x_{t+1}))], h'' = h' + FFN(RMSNorm(h')),
                  logits for x_{t+2} = the LM's own output head (shared) on RMSNorm(h''). Emb is the LM's own
                  token embedding (shared). use_next_embedding=False drops the Emb(x_{t+1}) half: an independent
                  head on the trunk, the design of Gloeckle et al. (2024, §2), which must guess x_{t+2} without x_{t+1}
    MTPLM         the LM plus its MTP module for training: forward(ids) returns the next-token logits and keeps the
                  MTP cross-entropy in .mtp_loss, so proofs.train.train(..., extra_loss=mtp_extra_loss(weight)) adds it
    MTPDraft      a draft object for speculative_generate: it reads the target's last hidden states (a forward hook
                  on the LM's decoder) and proposes x_{t+2} from the module. One proposal per round (k = 1)
    check_mtp     ConfigError for bad settings (weight < 0, a draft asked for more than one token per round, ...)

Indexing. The module's output at the position j of a fed token x_j combines the trunk's hidden state at j-1 with
Emb(x_j) and predicts x_{j+1}: two tokens ahead of the trunk state it reads (the trunk at j-1 has seen x_{<j}).
At j = 0 there is no trunk state; a zero vector stands in (the same in training and decoding; not in the loss).
So the module's training targets are the LM's own targets y (B, T), at positions 1..T-1.

Why a feed-forward block and not DeepSeek's Transformer block: the block's attention needs key/value entries of
its own, and the entry for a drafted token can only be built once the target's verification pass has computed the
trunk state before it. With one drafted token a round that entry could be filled a round late (serving engines
that run DeepSeek's module keep such a cache), but speculative.py writes a draft's cache when it proposes, and
changing it would touch a decoder other proofs share. A stateless module needs no cache of its own. Built on a DecoderLM without editing models.py
or config.py (this file is new: the fingerprints of existing proofs do not cover it).
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .config import ConfigError
from .feedforward import FeedForward
from .norms import RMSNorm


def check_mtp(lm, weight: float = 0.3) -> None:
    """A module needs a built DecoderLM (an embedding, a decoder and a head) and a non-negative loss weight."""
    for part in ("embed", "decoder", "head", "cfg"):
        if not hasattr(lm, part):
            raise ConfigError(f"MTP attaches to a built DecoderLM; {type(lm).__name__} has no .{part}.")
    if not (isinstance(weight, (int, float)) and weight >= 0):
        raise ConfigError(f"MTP loss weight {weight!r} must be a number >= 0.")


# --8<-- [start:module]
class MTPModule(nn.Module):
    """Predicts x_{j+1} from the trunk's hidden state at j-1 and (if use_next_embedding) the embedding of x_j."""

    def __init__(self, lm, use_next_embedding: bool = True):
        super().__init__()
        check_mtp(lm)
        C = lm.cfg.d_model
        self.use_next_embedding = use_next_embedding
        self.norm_h, self.norm_e = RMSNorm(C), RMSNorm(C)
        self.proj = nn.Linear(2 * C if use_next_embedding else C, C, bias=False)  # DeepSeek's M: (2C -> C)
        self.norm_ffn, self.ffn, self.norm_out = RMSNorm(C), FeedForward(lm.cfg), RMSNorm(C)

    def forward(self, h_prev: Tensor, emb: Tensor) -> Tensor:
        """h_prev (B, T, C) trunk states at j-1, emb (B, T, C) Emb(x_j) -> (B, T, C) states for the shared head."""
        parts = [self.norm_h(h_prev), self.norm_e(emb)] if self.use_next_embedding else [self.norm_h(h_prev)]
        x = self.proj(torch.cat(parts, -1))  # (B, T, C)
        x = x + self.ffn(self.norm_ffn(x))  # one residual feed-forward block
        return self.norm_out(x)


def shift_states(h: Tensor) -> Tensor:
    """(B, T, C) trunk states -> the state at j-1 for each position j, zeros at j = 0."""
    return torch.cat([torch.zeros_like(h[:, :1]), h[:, :-1]], 1)


class MTPLM(nn.Module):
    """A DecoderLM and its MTP module, trained together: forward returns the next-token logits (B, T, V)."""

    def __init__(self, lm, mtp: MTPModule):
        super().__init__()
        self.lm, self.mtp, self.cfg = lm, mtp, lm.cfg
        self.mtp_loss = torch.zeros(())

    def forward(self, ids: Tensor) -> Tensor:
        h = self.lm.decoder(self.lm.embed(ids))  # (B, T, C) the trunk, as DecoderLM.forward runs it
        mtp_logits = self.lm.head(self.mtp(shift_states(h), self.lm.embed.tok(ids)))  # (B, T, V): x_{j+1} from h_{j-1}
        # targets x_{j+1} for j = 1..T-2 are ids[:, 2:]; the last position's target is outside ids (train's y holds
        # it, but train passes the module only ids): T-2 positions per row enter the loss
        self.mtp_loss = F.cross_entropy(mtp_logits[:, 1:-1].reshape(-1, mtp_logits.shape[-1]), ids[:, 2:].reshape(-1))
        return self.lm.head(h)


def mtp_extra_loss(weight: float = 0.3) -> Callable[[nn.Module], Tensor]:
    """extra_loss for proofs.train.train: weight · the MTP cross-entropy of the last forward (the λ of DeepSeek-V3 §2.2)."""
    if not (isinstance(weight, (int, float)) and weight >= 0):
        raise ConfigError(f"MTP loss weight {weight!r} must be a number >= 0.")
    return lambda model: weight * model.mtp_loss
# --8<-- [end:module]


class _Stateless:
    """The draft's 'cache': the module keeps no keys or values, so a rollback has nothing to cut."""

    def truncate(self, lengths) -> None:
        pass


class _NoDecoder:
    def new_cache(self) -> list[dict]:
        return [{"self": _Stateless(), "cross": None}]


# --8<-- [start:draft]
class MTPDraft:
    """Draft for speculative_generate(target=lm, draft=MTPDraft(lm, mtp), ..., k=1) that costs no trunk pass.

    A forward hook on lm.decoder stores the trunk's hidden states of every cached target call by position (B, L, C).
    speculative_generate calls the draft first with the pending token x_j (the one the target emitted last), and the
    target's previous verification pass has already computed the trunk state at j-1: the draft is the module on
    (h_{j-1}, Emb(x_j)) and the shared head, a few small matmuls. Only the first call (the prompt, before any
    target pass) runs the trunk itself: one prefill. The decoder's second draft call each round only caches the
    proposal; this draft has no cache, so it returns zeros, which the decoder discards. A third call before the
    target has verified would be a second proposal that needs the trunk state of the first: ConfigError (k = 1).
    Call .close() (or use `with`) to remove the hook.
    """

    def __init__(self, lm, mtp: MTPModule):
        check_mtp(lm)
        self.lm, self.mtp, self.cfg = lm, mtp, lm.cfg
        self.decoder = _NoDecoder()
        self.states: Tensor | None = None  # (B, max_len, C) trunk hidden state by position, from the target's calls
        self.calls_since_target = 0
        self.trunk_passes = 0  # trunk passes the draft ran itself (the prompt's prefill)
        self._hook = lm.decoder.register_forward_hook(self._store, with_kwargs=True)

    def _store(self, module, args, kwargs, h: Tensor) -> None:
        pos = kwargs.get("positions")
        if pos is None:  # a call without a cache (training, or the draft's own prefill): nothing to store
            return
        B = h.shape[0]
        if self.states is None or self.states.shape[0] != B or self.states.dtype != h.dtype:
            self.states = torch.zeros(B, self.cfg.max_len + 1, h.shape[-1], dtype=h.dtype)
        self.states[torch.arange(B)[:, None], pos] = h.detach()
        self.calls_since_target = 0

    @torch.no_grad()
    def __call__(self, ids: Tensor, cache=None, positions: Tensor | None = None) -> Tensor:
        """ids (B, P) tokens at positions (B, P) -> (B, P, V) logits; only the last position is a real proposal."""
        B, P = ids.shape
        V = self.cfg.vocab_size
        if positions is None:
            positions = torch.arange(P).expand(B, P)
        self.calls_since_target += 1
        if self.calls_since_target == 2:  # the decoder caching the proposal: nothing to cache, output unused
            return torch.zeros(B, P, V, dtype=self.lm.embed.tok.weight.dtype)
        if self.calls_since_target > 2:
            raise ConfigError("one MTP module drafts one token per round (x_{t+2} from the trunk state at t): call "
                              "speculative_generate with k=1, or train a module per extra depth (DeepSeek-V3 §2.2).")
        if self.states is None:  # the prompt, before any target call: the draft runs the trunk once itself
            if not bool((positions[:, 0] == 0).all()):
                raise ConfigError("the MTP draft's first call must be the prompt from position 0.")
            h = self.lm.decoder(self.lm.embed(ids))  # (B, P, C)
            self.trunk_passes += 1
            h_prev = shift_states(h)
            self.calls_since_target = 1
        else:
            prev = (positions - 1).clamp(min=0)
            h_prev = self.states[torch.arange(B)[:, None], prev]  # (B, P, C)
            h_prev = torch.where((positions == 0)[..., None], torch.zeros_like(h_prev), h_prev)
        return self.lm.head(self.mtp(h_prev, self.lm.embed.tok(ids)))

    def close(self) -> None:
        self._hook.remove()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()
# --8<-- [end:draft]
