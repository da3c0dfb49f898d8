"""Sigmoid attention and gated attention: two changes at the two ends of the softmax, as hooks of MultiHeadAttention.

    "sigmoid"  SigmoidAttention: the row softmax replaced by an elementwise σ(s_ij + b) (Ramapuram et al. 2024). Rows
               no longer sum to 1: at init each weight is about σ(0) = 1/2, so a row of n keys sums to about n/2. The
               bias b = -log n turns σ(s - log n) = 1/(1 + n e^{-s}) into about e^s / n, so the row sum stays near
               E[e^s] whatever n. `cfg.sigmoid_bias`: a fixed b for every row (Ramapuram et al.'s released configs
               set one b = -log n for the training length n), or None = -log(n_i) with n_i the number of keys query i
               sees: our variant, under which every causal row sums to about E[e^s] whatever its position. Decoding
               with the cache computes what the full forward does under either.
    "gated"    GatedAttention: the softmax attention unchanged, its concatenated head outputs Y multiplied by a sigmoid
               gate from the layer input before W_O: Y' = Y ⊙ σ(X W_θ) (Qiu et al. 2025, position G1 of Fig. 1,
               elementwise). Without it the value-to-output path W_V ... W_O is linear in the values.

Both keep attention's projections, masks from positions (attention.py, `hidden`) and its KV cache: `mixer_lm` gives
their layers KVCache, and decoding with it computes what the full forward does.
"""

from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from .attention import MultiHeadAttention, Pos, hidden
from .config import ConfigError, TransformerConfig


def check_plain(cfg: TransformerConfig, name: str) -> None:
    """These mixers subclass MultiHeadAttention itself: positions that need another attention class are refused."""
    if cfg.positions not in ("none", "learned", "sinusoidal"):
        raise ConfigError(f"the {name!r} mixer is built on the plain MultiHeadAttention: positions={cfg.positions!r} "
                          f"lives in another attention class. Use positions='none', 'learned' or 'sinusoidal'.")
    if cfg.kv_latent or cfg.score_fn != "dot":
        raise ConfigError(f"the {name!r} mixer takes dot-product scores on full keys: set kv_latent=0 and score_fn='dot'.")


# --8<-- [start:sigmoid]
class SigmoidAttention(MultiHeadAttention):
    """y_i = Σ_{j visible} σ(s_ij + b_i) v_j, s_ij = q_i·k_j / √d: no normalisation across the row.

    score() keeps the logits; forward masks them and takes a softmax we do not use; mix() rebuilds the visible keys
    from the positions (the causal mask, window and sinks of `hidden`) and returns σ(s + b) ⊙ visible, times V.
    """

    def __init__(self, cfg: TransformerConfig):
        super().__init__(cfg)
        check_plain(cfg, "sigmoid")
        if cfg.attn_impl == "tiled":
            raise ConfigError("attn_impl='tiled' is the online softmax; sigmoid attention needs no running max or sum: "
                              "use attn_impl='auto' or 'explicit'.")
        self._logits: Optional[Tensor] = None
        self._call: dict = {}

    def forward(self, x: Tensor, kv: Optional[Tensor] = None, *, causal: bool = False, key_padding_mask=None,
                attn_mask=None, cache=None, positions=None, prefix: int = 0) -> Tensor:
        self._call = dict(key_padding_mask=key_padding_mask, attn_mask=attn_mask, prefix=prefix,
                          empty=getattr(cache, "has_gaps", False), cross=kv is not None)
        return super().forward(x, kv, causal=causal, key_padding_mask=key_padding_mask, attn_mask=attn_mask,
                               cache=cache, positions=positions, prefix=prefix)

    def score(self, q: Tensor, k: Tensor, pos: Optional[Pos] = None) -> Tensor:
        self._logits = super().score(q, k, pos)  # (B, nh, Tq, Tk), before any mask
        return self._logits

    def visible(self, pos: Pos) -> Tensor:
        """(B|1, 1|nh, Tq, Tk) bool, True where query i may read key j: attention's masks, rebuilt from positions."""
        q_pos, k_pos = pos
        c = self._call
        window = self.cfg.window if (self.causal or not c["cross"]) else 0
        hide = hidden(q_pos, k_pos, self.causal, window, self.cfg.attn_sinks, c["prefix"])  # (B|1, 1, Tq, Tk)
        if c["attn_mask"] is not None:
            m = c["attn_mask"]
            hide = hide | (m if m.dim() == 3 else m[None])[:, None]
        if c["key_padding_mask"] is not None:
            hide = hide | c["key_padding_mask"][:, None, None, :]
        return ~hide

    def bias_b(self, see: Tensor) -> Tensor | float:
        """b: the configured constant, or -log(n_i) with n_i the keys query i sees (at least 1)."""
        if self.cfg.sigmoid_bias is not None:
            return self.cfg.sigmoid_bias
        n = see.sum(-1, keepdim=True).clamp(min=1)  # (B|1, 1, Tq, 1)
        return -torch.log(n.to(self._logits.dtype))

    def mix(self, attn: Tensor, v: Tensor, pos: Optional[Pos] = None) -> Tensor:
        q_pos, k_pos = pos
        s = self._logits
        extra = self.bias(q_pos, k_pos)  # a position bias, where a subclass adds one
        s = s if extra is None else s + extra
        see = self.visible(pos)
        w = torch.sigmoid(s + self.bias_b(see)) * see  # (B, nh, Tq, Tk): hidden keys weigh exactly 0
        w = self.drop_attn(w)
        if self.record:
            self.weights = w.detach()
        return w @ v  # (B, nh, Tq, hs)
# --8<-- [end:sigmoid]


# --8<-- [start:gated]
class OutputGate(nn.Linear):
    """W_O with a gate in front: y ↦ W_O (y ⊙ σ(x W_θ + b_θ)), x the layer input of the current call.

    It is an nn.Linear (W_O's own weight and bias, so the shared initialisation scales it like any W_O) that holds
    the gate's projection; `x` is set by GatedAttention before attention runs, `last_gate` kept for measurement.
    """

    def __init__(self, d_in: int, d_out: int, bias: bool, d_model: int):
        super().__init__(d_in, d_out, bias=bias)
        self.w_theta = nn.Linear(d_model, d_in, bias=bias)  # one gate per head dimension (elementwise G1)
        self.x: Optional[Tensor] = None
        self.last_gate: Optional[Tensor] = None

    def forward(self, y: Tensor) -> Tensor:
        if self.x is None:
            raise ConfigError("OutputGate has no layer input: call it through GatedAttention.forward.")
        g = torch.sigmoid(self.w_theta(self.x))  # (B, Tq, nh·hs)
        self.last_gate = g.detach()
        return F.linear(y * g, self.weight, self.bias)


class GatedAttention(MultiHeadAttention):
    """Softmax attention whose concatenated head outputs are gated elementwise before W_O: Y' = Y ⊙ σ(X W_θ).

    The gate's input is the attention layer's input (after the pre-norm in a Pre-LN block), the queries' rows: it
    depends on the query token, not on the keys, so a cache of keys and values serves it unchanged.
    """

    def __init__(self, cfg: TransformerConfig):
        super().__init__(cfg)
        check_plain(cfg, "gated")
        bias = cfg.bias if cfg.attn_bias is None else cfg.attn_bias
        self.w_o = OutputGate(cfg.d_model, cfg.d_model, bias, cfg.d_model)

    def forward(self, x: Tensor, kv: Optional[Tensor] = None, **kw) -> Tensor:
        self.w_o.x = x  # the gate reads the queries' inputs
        try:
            return super().forward(x, kv, **kw)
        finally:
            self.w_o.x = None
# --8<-- [end:gated]
