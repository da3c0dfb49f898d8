"""Layers: the residual sub-layer connection and the encoder and decoder layers built from it.

    Post-LN    norm(x + drop(f(x)))                 (Vaswani et al. 2017)
    Pre-LN     x + drop(f(norm(x)))                 (plus a final norm after the stack)
    DeepNorm   norm(alpha·x + drop(f(x)))           (Wang et al. 2022; its beta init is in models.init_weights)
    parallel   x + attn(norm(x)) + ffn(norm(x))     (GPT-J, PaLM: one norm, both read the same input)
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn as nn
from torch import Tensor

from .attention import MultiHeadAttention
from .config import ConfigError, TransformerConfig
from .feedforward import make_ffn
from .norms import make_norm
from .variants import AdditiveAttention, make_self_attention


# --8<-- [start:residual]
class Residual(nn.Module):
    """One sub-layer connection: Post-LN norm(alpha·x + drop(f(x))) or Pre-LN x + drop(f(norm(x)))."""

    def __init__(self, cfg: TransformerConfig, alpha: float = 1.0):
        super().__init__()
        self.cfg = cfg
        self.alpha = alpha  # DeepNorm's up-weighting of the identity path (1 otherwise)
        self.norm = make_norm(cfg.norm, cfg.d_model, cfg.norm_eps)
        self.drop_residual = nn.Dropout(cfg.dropout_residual)

    def forward(self, x: Tensor, f) -> Tensor:
        keep = (x if self.alpha == 1.0 else self.alpha * x) if self.cfg.residual else 0.0
        if self.cfg.norm_position == "pre":
            return keep + self.drop_residual(f(self.norm(x)))
        return self.norm(keep + self.drop_residual(f(x)))
# --8<-- [end:residual]


class EncoderLayer(nn.Module):
    """Self-attention then the FFN, each in a residual sub-layer (or both on one norm: parallel_block)."""

    def __init__(self, cfg: TransformerConfig, alpha: float = 1.0):
        super().__init__()
        self.cfg = cfg
        self.self_attn = make_self_attention(cfg)
        self.ffn = make_ffn(cfg)
        self.sub_attn = Residual(cfg, alpha)
        self.sub_ffn = Residual(cfg, alpha) if not cfg.parallel_block else None

    def forward(self, x: Tensor, key_padding_mask: Optional[Tensor] = None, causal: bool = False) -> Tensor:
        attend = lambda h: self.self_attn(h, causal=causal, key_padding_mask=key_padding_mask)  # noqa: E731
        if self.cfg.parallel_block:
            return self.sub_attn(x, lambda h: attend(h) + self.ffn(h))  # one norm, both branches read it
        x = self.sub_attn(x, attend)
        return self.sub_ffn(x, self.ffn)


class DecoderLayer(nn.Module):
    """Masked self-attention, then (if cross) attention over the encoder output, then the FFN."""

    def __init__(self, cfg: TransformerConfig, cross: bool = True, alpha: float = 1.0):
        super().__init__()
        if cross and cfg.parallel_block:
            raise ConfigError("parallel_block=True is for decoder-only and encoder stacks: a decoder with "
                              "cross-attention has three sub-layers in sequence. Use DecoderLM or set parallel_block=False.")
        self.cfg = cfg
        self.self_attn = make_self_attention(cfg)
        cross_cls = AdditiveAttention if cfg.score_fn == "additive" else MultiHeadAttention  # no positions here
        self.cross_attn = cross_cls(cfg) if cross else None
        self.ffn = make_ffn(cfg)
        self.sub_self = Residual(cfg, alpha)
        self.sub_cross = Residual(cfg, alpha) if cross else None
        self.sub_ffn = Residual(cfg, alpha) if not cfg.parallel_block else None

    def forward(
        self,
        x: Tensor,
        memory: Optional[Tensor] = None,
        tgt_padding_mask: Optional[Tensor] = None,
        memory_padding_mask: Optional[Tensor] = None,
        mem: Optional[Tensor] = None,
        cache: Optional[dict] = None,
        positions: Optional[Tensor] = None,
        prefix: int = 0,
    ) -> Tensor:
        """memory: the encoder output (cross-attention). mem: (B, M, C) this layer's inputs over earlier
        segments (Transformer-XL recurrence), extra keys and values in front of x; queries come from x only.
        cache: {"self": KVCache, "cross": KVCache}, this layer's keys/values kept across decoding steps
        (Decoder.new_cache). positions: (B, T) positions of x (default: after the cached ones).
        prefix: keys before this position are visible to every query (prefix LM)."""
        self_cache, cross_cache = (None, None) if cache is None else (cache["self"], cache["cross"])
        attend = lambda h: self.self_attend(h, mem, tgt_padding_mask, self_cache, positions, prefix)  # noqa: E731
        if self.cfg.parallel_block:
            return self.sub_self(x, lambda h: attend(h) + self.ffn(h))
        x = self.sub_self(x, attend)
        if self.cross_attn is not None:
            if memory is None:
                raise ConfigError("this decoder layer has cross-attention: pass the encoder output as memory.")
            x = self.sub_cross(
                x, lambda h: self.cross_attn(h, memory, key_padding_mask=memory_padding_mask, cache=cross_cache))
        return self.sub_ffn(x, self.ffn)

    def self_attend(self, h: Tensor, mem: Optional[Tensor], padding_mask: Optional[Tensor], cache=None,
                    positions: Optional[Tensor] = None, prefix: int = 0) -> Tensor:
        """Causal self-attention of h (B, T, C) over [mem ∘ h] (B, M+T, C); mem=None or M=0: over h alone
        (and over the keys/values of earlier steps when a cache is given)."""
        if mem is None or mem.shape[1] == 0:
            return self.self_attn(h, causal=True, key_padding_mask=padding_mask, cache=cache, positions=positions,
                                  prefix=prefix)
        if cache is not None:
            raise ConfigError("a key/value cache and Transformer-XL mems both prepend earlier positions: use one.")
        if self.cfg.norm_position == "pre":
            mem = self.sub_self.norm(mem)  # Pre-LN: the cached inputs pass the same norm as h did
        kv = torch.cat([mem, h], dim=1)  # (B, M+T, C): keys/values from [SG(memory) ∘ h]
        if padding_mask is not None:  # (B, T) -> (B, M+T): cached states are never padding
            padding_mask = torch.cat([padding_mask.new_zeros(h.shape[0], mem.shape[1]), padding_mask], dim=1)
        return self.self_attn(h, kv, causal=True, key_padding_mask=padding_mask, prefix=prefix)  # h aligned at the end
