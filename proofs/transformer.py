"""The one shared Transformer that every proof on the site flips switches of.

Read it top to bottom: config, attention, sub-layers, embeddings, stacks, models.
Every design choice a question asks about is one field of `TransformerConfig`;
the defaults are those of Vaswani et al. (2017): Post-LN, sinusoidal positions,
embeddings multiplied by sqrt(d_model), one matrix shared by both embeddings and
the pre-softmax projection, dropout 0.1 on embeddings+PE and on sub-layer outputs.

Shape comments use B = batch, T = time (Tq queries, Tk keys), nh = heads,
hs = head size (d_k = d_v = d_model / n_heads), C = d_model, V = vocabulary.
Mask convention (as in torch.nn): a bool tensor where True marks a position
that must NOT be attended to.
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import dataclass, fields
from typing import Iterator, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

__all__ = [
    "TransformerConfig",
    "ConfigError",
    "MultiHeadAttention",
    "ShawAttention",
    "XLAttention",
    "AdditiveAttention",
    "make_self_attention",
    "rel_shift",
    "FeedForward",
    "Embeddings",
    "EncoderLayer",
    "DecoderLayer",
    "Encoder",
    "Decoder",
    "EncoderTagger",
    "DecoderLM",
    "EncoderDecoder",
    "sinusoidal_table",
    "causal_mask",
    "record_attention",
    "greedy",
]


class ConfigError(ValueError):
    """A configuration or input that the model cannot use; the message says how to fix it."""


# Allowed values of the string-valued switches, checked in __post_init__.
_CHOICES = {
    "attn_scale": ("sqrt_dk", "none", "dk"),
    "score_fn": ("dot", "additive"),
    "qk_norm": ("none", "layer"),
    "norm": ("layer", "batch", "none"),
    "norm_position": ("post", "pre"),
    "positions": ("sinusoidal", "learned", "none", "shaw", "xl"),
    "emb_init": ("normal_inv_sqrt_d", "normal_1"),
    "tie_embeddings": ("all", "decoder", "none"),
    "mask_fill": ("-inf", "min"),
    "activation": ("relu", "gelu"),
}


@dataclass
class TransformerConfig:
    # --- sizes -----------------------------------------------------------
    vocab_size: int = 32  # tokens in the (shared) vocabulary V
    src_vocab_size: Optional[int] = None  # encoder vocabulary if different from vocab_size (forbids tie_embeddings="all")
    d_model: int = 64  # C: width of every residual stream (must be divisible by n_heads)
    n_heads: int = 4  # nh: attention heads; each has d_k = d_v = d_model / n_heads
    d_ff: int = 128  # hidden width of the position-wise feed-forward network
    n_layers: int = 2  # encoder layers (and decoder layers, unless n_dec_layers is set)
    n_dec_layers: Optional[int] = None  # decoder layers of an encoder-decoder or decoder-only model
    max_len: int = 64  # rows of a learned position table; longer inputs are an error for positions="learned"
    # --- attention -------------------------------------------------------
    attn_scale: str = "sqrt_dk"  # divide q.k by sqrt(d_k) (paper), by nothing, or by d_k
    score_fn: str = "dot"  # "additive": Bahdanau's v·tanh(W1 q + W2 k) per head instead of q·k
    qk_norm: str = "none"  # "layer": LayerNorm each head's q and k over d_k before the dot product (QK-norm)
    share_qk: bool = False  # use one matrix for W_Q and W_K (makes the score matrix symmetric)
    qkv_proj: bool = True  # False: no W_Q, W_K, W_V; each head's q = k = v = its slice of the input (W_O stays)
    mask_fill: str = "-inf"  # value written into hidden scores before softmax: -inf or the dtype's minimum
    fast_path: bool = True  # use F.scaled_dot_product_attention when no one needs the weights
    # --- normalisation and residuals ---------------------------------------
    norm: str = "layer"  # LayerNorm (per token, over C), BatchNorm (per channel, over B*T tokens) or none
    norm_position: str = "post"  # post: norm(x + f(x)) as in the paper; pre: x + f(norm(x)) plus a final norm
    residual: bool = True  # keep the identity path around every sub-layer
    norm_eps: float = 1e-5  # epsilon inside LayerNorm / BatchNorm
    # --- positions and embeddings ------------------------------------------
    positions: str = "sinusoidal"  # absolute sinusoids (paper), learned table, none, Shaw relative, or Transformer-XL relative
    rel_clip: int = 16  # Shaw: offsets j-i clipped to [-k, k], so 2k+1 learned vectors serve any length
    rel_on_values: bool = True  # Shaw: add a^V_ij to the values too (a^K_ij on the keys always)
    rel_per_head: bool = False  # Shaw: one relative table per head instead of one shared by all heads
    mem_len: int = 0  # Transformer-XL: previous-segment states cached per layer (0 = no recurrence)
    learned_pos_std: float = 1.0  # init std of a learned position table (0.02 tables learn far slower)
    scale_embeddings: bool = True  # multiply token embeddings by sqrt(d_model) before adding positions
    emb_init: str = "normal_inv_sqrt_d"  # N(0, 1/d_model) as in tensor2tensor, or N(0, 1) as torch.nn.Embedding
    tie_embeddings: str = "all"  # share encoder emb, decoder emb and output projection; or decoder emb+output; or none
    # --- feed-forward ----------------------------------------------------
    activation: str = "relu"  # non-linearity between the FFN's two linear maps
    bias: bool = True  # biases in the Q/K/V/O projections and the FFN
    # --- dropout, one probability per site -------------------------------------
    dropout_emb: float = 0.1  # on the sum of embeddings and positional encodings (paper, section 5.4)
    dropout_residual: float = 0.1  # on each sub-layer's output before the residual add (paper, section 5.4)
    dropout_attn: float = 0.0  # on attention weights after softmax (tensor2tensor, not in the paper)
    dropout_ffn: float = 0.0  # on the FFN hidden activations after the ReLU (tensor2tensor, not in the paper)

    def __post_init__(self) -> None:
        for name, allowed in _CHOICES.items():
            value = getattr(self, name)
            if value not in allowed:
                raise ConfigError(
                    f"TransformerConfig.{name}={value!r} is not an option; use one of {', '.join(map(repr, allowed))}."
                )
        for name in ("vocab_size", "d_model", "n_heads", "d_ff", "n_layers", "max_len"):
            if int(getattr(self, name)) < 1:
                raise ConfigError(f"TransformerConfig.{name}={getattr(self, name)} must be a positive integer.")
        if int(self.rel_clip) < 0:
            raise ConfigError(f"TransformerConfig.rel_clip={self.rel_clip} must be >= 0: offsets are clipped to [-k, k].")
        if self.d_model % self.n_heads:
            fits = [h for h in range(1, self.d_model + 1) if self.d_model % h == 0]
            raise ConfigError(
                f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}: each head gets d_model/n_heads "
                f"channels. Pick n_heads from {fits[:12]} or change d_model to a multiple of {self.n_heads}."
            )
        for name in ("dropout_emb", "dropout_residual", "dropout_attn", "dropout_ffn"):
            p = getattr(self, name)
            if not 0.0 <= p < 1.0:
                raise ConfigError(f"TransformerConfig.{name}={p} must be a probability in [0, 1).")
        if int(self.mem_len) < 0:
            raise ConfigError(f"TransformerConfig.mem_len={self.mem_len} must be >= 0 (0 = no segment memory).")
        if self.score_fn == "additive":
            if self.positions in ("shaw", "xl"):
                raise ConfigError(
                    f"score_fn='additive' and positions={self.positions!r} each replace the attention score; they do "
                    f"not combine. Use positions='sinusoidal' (or 'learned', 'none') with additive scores, or score_fn='dot'."
                )
            if self.qk_norm != "none":
                raise ConfigError(
                    "qk_norm='layer' normalises q and k to bound q·k, but score_fn='additive' computes no q·k: its "
                    "logits v·tanh(q + k) are already bounded by ‖v‖₁. Set qk_norm='none' (or score_fn='dot')."
                )
            if self.attn_scale != "sqrt_dk":
                raise ConfigError(
                    f"attn_scale={self.attn_scale!r} scales q·k, which score_fn='additive' does not compute, so it "
                    f"would change nothing. Leave attn_scale='sqrt_dk' (the default, unused by additive scores) or use score_fn='dot'."
                )
        if self.share_qk and not self.qkv_proj:
            raise ConfigError(
                "share_qk=True ties W_K to W_Q, but qkv_proj=False has no W_Q or W_K: q = k = x already. "
                "Set share_qk=False (or qkv_proj=True)."
            )
        if self.tie_embeddings == "all" and self.src_vocab_size not in (None, self.vocab_size):
            raise ConfigError(
                f"tie_embeddings='all' shares one matrix between encoder and decoder, but src_vocab_size="
                f"{self.src_vocab_size} differs from vocab_size={self.vocab_size}. Use tie_embeddings='decoder' or one vocabulary."
            )

    @property
    def d_head(self) -> int:
        return self.d_model // self.n_heads

    def replace(self, **changes) -> "TransformerConfig":
        """A copy with some fields changed: the one-switch ablation every proof makes."""
        unknown = set(changes) - {f.name for f in fields(self)}
        if unknown:
            raise ConfigError(f"TransformerConfig has no field(s) {sorted(unknown)}; see the dataclass for the switches.")
        return TransformerConfig(**{**{f.name: getattr(self, f.name) for f in fields(self)}, **changes})


# ----------------------------------------------------------------------------
# Masks and positions
# ----------------------------------------------------------------------------


def causal_mask(t_q: int, t_k: Optional[int] = None, device=None) -> Tensor:
    """(Tq, Tk) bool, True above the diagonal: query i may not see key j > i (aligned at the end)."""
    t_k = t_q if t_k is None else t_k
    i = torch.arange(t_q, device=device)[:, None] + (t_k - t_q)
    j = torch.arange(t_k, device=device)[None, :]
    return j > i


def sinusoidal_table(length: int, d_model: int, base: float = 10000.0) -> Tensor:
    """(length, d_model): PE[pos, 2i] = sin(pos / base^(2i/d)), PE[pos, 2i+1] = cos(same)."""
    pos = torch.arange(length, dtype=torch.float64)[:, None]  # (T, 1)
    inv_freq = base ** (-torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)  # (C/2,)
    angle = pos * inv_freq  # (T, C/2)
    pe = torch.zeros(length, d_model, dtype=torch.float64)
    pe[:, 0::2] = torch.sin(angle)
    pe[:, 1::2] = torch.cos(angle[:, : d_model // 2])
    return pe.float()


def _check_mask(mask: Optional[Tensor], name: str, allowed: list[tuple[int, ...]], hint: str) -> None:
    if mask is None:
        return
    if not isinstance(mask, Tensor) or mask.dtype != torch.bool:
        got = mask.dtype if isinstance(mask, Tensor) else type(mask).__name__
        raise ConfigError(
            f"{name} must be a bool tensor (True = hide that position), got {got}. "
            f"Convert a 0/1 mask with `mask.bool()` or an additive float mask with `mask == float('-inf')`."
        )
    if tuple(mask.shape) not in allowed:
        raise ConfigError(f"{name} has shape {tuple(mask.shape)}; expected {' or '.join(map(str, allowed))} ({hint}).")


# ----------------------------------------------------------------------------
# Attention
# ----------------------------------------------------------------------------


class MultiHeadAttention(nn.Module):
    """Scaled dot-product attention with h heads.

    `score` is the one method a relative-position variant overrides: it maps
    queries and keys to the logits that the mask and softmax are applied to.
    `mix` maps the weights and values to the heads' outputs.
    """

    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.cfg = cfg
        C, nh = cfg.d_model, cfg.n_heads
        self.n_heads, self.d_head = nh, cfg.d_head
        proj = (lambda: nn.Linear(C, C, bias=cfg.bias)) if cfg.qkv_proj else nn.Identity  # qkv_proj=False: q=k=v=x
        self.w_q = proj()
        self.w_k = None if cfg.share_qk else proj()  # share_qk: keys use w_q
        self.w_v = proj()
        self.w_o = nn.Linear(C, C, bias=cfg.bias)
        affine_norm = cfg.qk_norm == "layer"
        self.q_norm = nn.LayerNorm(self.d_head, eps=cfg.norm_eps) if affine_norm else nn.Identity()
        self.k_norm = nn.LayerNorm(self.d_head, eps=cfg.norm_eps) if affine_norm else nn.Identity()
        self.drop_attn = nn.Dropout(cfg.dropout_attn)
        self.scale = {"sqrt_dk": self.d_head**-0.5, "none": 1.0, "dk": 1.0 / self.d_head}[cfg.attn_scale]
        self.record = False  # set by record_attention(): keep the last softmax weights in .weights
        self.weights: Optional[Tensor] = None  # (B, nh, Tq, Tk) from the last explicit-path call

    # -- the overridable pieces ---------------------------------------------------
    def score(self, q: Tensor, k: Tensor) -> Tensor:
        """(B, nh, Tq, hs), (B, nh, Tk, hs) -> (B, nh, Tq, Tk) scaled logits."""
        return (q @ k.transpose(-2, -1)) * self.scale

    def mix(self, attn: Tensor, v: Tensor) -> Tensor:
        """(B, nh, Tq, Tk), (B, nh, Tk, hs) -> (B, nh, Tq, hs)."""
        return attn @ v

    # -- helpers -------------------------------------------------------------------
    def _heads(self, x: Tensor) -> Tensor:
        B, T, C = x.shape
        return x.view(B, T, self.n_heads, self.d_head).transpose(1, 2)  # (B, nh, T, hs)

    def uses_fast_path(self) -> bool:
        """True when F.scaled_dot_product_attention computes exactly what the explicit path would."""
        return (
            self.cfg.fast_path
            and not self.record
            and type(self).score is MultiHeadAttention.score
            and type(self).mix is MultiHeadAttention.mix
            and not (self.training and self.drop_attn.p > 0)  # keep attention dropout a visible module
            and self.cfg.mask_fill == "-inf"
        )

    def project(self, x: Tensor, kv: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Queries from x, keys and values from kv, split into heads and (optionally) QK-normalised."""
        q = self._heads(self.w_q(x))  # (B, nh, Tq, hs)
        k = self._heads((self.w_q if self.w_k is None else self.w_k)(kv))  # (B, nh, Tk, hs)
        v = self._heads(self.w_v(kv))  # (B, nh, Tk, hs)
        return self.q_norm(q), self.k_norm(k), v

    # --8<-- [start:kv_cache]
    def project_cached(self, x: Tensor, kv: Tensor, cache: dict, self_attention: bool) -> tuple[Tensor, Tensor, Tensor]:
        """project() for incremental decoding: keys and values of earlier steps come from `cache`.

        Self-attention: only the new tokens x are projected; their keys/values are appended to
        cache["k"], cache["v"] (B, nh, T_past + Tq, hs). Cross-attention: the encoder output kv
        is projected at the first step; every later step reuses the same keys/values.
        """
        if not isinstance(cache, dict) or ("k" in cache and cache["k"].shape[0] != x.shape[0]):
            raise ConfigError("cache must be a dict filled by earlier steps of this same batch: start each "
                              "generation with a fresh one (Decoder.new_cache()).")
        if self_attention:
            q, k, v = self.project(x, x)  # (B, nh, Tq, hs): the new tokens only
            if "k" in cache:
                k, v = torch.cat([cache["k"], k], dim=2), torch.cat([cache["v"], v], dim=2)
        elif "k" not in cache:
            q, k, v = self.project(x, kv)  # first step: the encoder output's keys/values, once
        else:
            q = self.q_norm(self._heads(self.w_q(x)))  # later steps: the queries only, as in project()
            k, v = cache["k"], cache["v"]
        cache["k"], cache["v"] = k, v
        return q, k, v
    # --8<-- [end:kv_cache]

    def forward(
        self,
        x: Tensor,
        kv: Optional[Tensor] = None,
        *,
        causal: bool = False,
        key_padding_mask: Optional[Tensor] = None,
        attn_mask: Optional[Tensor] = None,
        cache: Optional[dict] = None,
    ) -> Tensor:
        """x: (B, Tq, C) queries; kv: (B, Tk, C) keys/values (x itself for self-attention).

        key_padding_mask: (B, Tk) bool, True at padding. attn_mask: (Tq, Tk) or (B, Tq, Tk) bool,
        True where query i must not see key j. causal: hide keys after each query.
        cache: a dict kept across the steps of incremental decoding (see project_cached); Tk then
        counts every cached key, and the masks must cover them all.
        """
        self_attention = kv is None
        kv = x if kv is None else kv
        if x.dim() != 3 or x.shape[-1] != self.cfg.d_model or kv.dim() != 3 or kv.shape[-1] != self.cfg.d_model:
            raise ConfigError(
                f"attention expects (batch, time, d_model={self.cfg.d_model}) inputs, got {tuple(x.shape)} and "
                f"{tuple(kv.shape)}; embed token ids first or check d_model."
            )
        B, Tq, _ = x.shape
        q, k, v = self.project(x, kv) if cache is None else self.project_cached(x, kv, cache, self_attention)
        Tk = k.shape[2]
        _check_mask(key_padding_mask, "key_padding_mask", [(B, Tk)], "batch, key length")
        _check_mask(attn_mask, "attn_mask", [(Tq, Tk), (B, Tq, Tk)], "query length, key length")

        hide = None  # (B or 1, 1, Tq, Tk) bool
        if causal and Tq > 1:  # one query aligned at the end sees every key: nothing to hide
            hide = causal_mask(Tq, Tk, device=x.device)[None, None]
        if attn_mask is not None:
            m = attn_mask if attn_mask.dim() == 3 else attn_mask[None]
            hide = m[:, None] if hide is None else hide | m[:, None]
        if key_padding_mask is not None:
            m = key_padding_mask[:, None, None, :]
            hide = m if hide is None else hide | m

        if self.uses_fast_path():
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=None if hide is None else ~hide, scale=self.scale)
        else:
            s = self.score(q, k)  # (B, nh, Tq, Tk)
            if hide is not None:
                fill = float("-inf") if self.cfg.mask_fill == "-inf" else torch.finfo(s.dtype).min
                s = s.masked_fill(hide, fill)
            a = self.drop_attn(torch.softmax(s, dim=-1))
            if self.record:
                self.weights = a.detach()
            y = self.mix(a, v)  # (B, nh, Tq, hs)
        y = y.transpose(1, 2).reshape(B, Tq, self.cfg.d_model)  # (B, Tq, C)
        return self.w_o(y)


@contextmanager
def record_attention(model: nn.Module) -> Iterator[list[MultiHeadAttention]]:
    """Inside the block every attention module keeps its softmax weights in `.weights` (explicit path)."""
    mods = [m for m in model.modules() if isinstance(m, MultiHeadAttention)]
    for m in mods:
        m.record = True
    try:
        yield mods
    finally:
        for m in mods:
            m.record = False


# --8<-- [start:shaw]
class ShawAttention(MultiHeadAttention):
    """Shaw et al. (2018) relative position representations, as a new `score` and `mix`.

        e_ij   = q_i · (k_j + a^K_ij) / sqrt(d_k)         logits (the scale is attn_scale's; mask, softmax -> α_ij)
        z_i    = Σ_j α_ij (v_j + a^V_ij)                  outputs (a^V only if cfg.rel_on_values)
        a^K_ij = w^K[clip(j - i, -k, k) + k]              one row of a (2k+1, hs) table, k = cfg.rel_clip

    The 2k+1 rows serve every length. No (Tq, Tk, hs) tensor is built: for keys,
    q_i is dotted with the 2k+1 rows once and the result is picked per (i, j) by
    offset; for values, α_ij is summed into its offset's bucket, then the buckets
    meet the table. Memory stays that of the (Tq, Tk) score matrix.
    """

    def __init__(self, cfg: TransformerConfig):
        super().__init__(cfg)
        k, hs = cfg.rel_clip, self.d_head
        rows = (self.n_heads if cfg.rel_per_head else 1, 2 * k + 1, hs)  # (nh or 1, 2k+1, hs)
        # N(0, 1): the scale of the k_j and v_j components they are added to at initialisation
        self.rel_k = nn.Parameter(torch.randn(rows))  # w^K
        self.rel_v = nn.Parameter(torch.randn(rows)) if cfg.rel_on_values else None  # w^V

    def rel_index(self, t_q: int, t_k: int, device=None) -> Tensor:
        """(Tq, Tk) long: table row clip(j - i, -k, k) + k of each pair (queries aligned at the end, as causal_mask)."""
        k = self.cfg.rel_clip
        i = torch.arange(t_q, device=device)[:, None] + (t_k - t_q)
        j = torch.arange(t_k, device=device)[None, :]
        return (j - i).clamp(-k, k) + k

    def score(self, q: Tensor, k: Tensor) -> Tensor:
        B, nh, Tq, hs = q.shape
        idx = self.rel_index(Tq, k.shape[2], q.device).expand(B, nh, -1, -1)  # (B, nh, Tq, Tk)
        content = q @ k.transpose(-2, -1)  # (B, nh, Tq, Tk): q_i · k_j
        q_rows = q @ self.rel_k.transpose(-2, -1)  # (B, nh, Tq, 2k+1): q_i · w^K_r for every row r
        position = q_rows.gather(-1, idx)  # (B, nh, Tq, Tk): q_i · a^K_ij
        return (content + position) * self.scale

    def mix(self, attn: Tensor, v: Tensor) -> Tensor:
        y = attn @ v  # (B, nh, Tq, hs): Σ_j α_ij v_j
        if self.rel_v is None:
            return y
        B, nh, Tq, Tk = attn.shape
        idx = self.rel_index(Tq, Tk, attn.device).expand(B, nh, -1, -1)  # (B, nh, Tq, Tk)
        buckets = attn.new_zeros(B, nh, Tq, self.rel_v.shape[1]).scatter_add(-1, idx, attn)  # (B, nh, Tq, 2k+1)
        return y + buckets @ self.rel_v  # Σ_r (Σ_{j: row r} α_ij) w^V_r = Σ_j α_ij a^V_ij
# --8<-- [end:shaw]


# --8<-- [start:xl]
def rel_shift(x: Tensor, t_k: int) -> Tensor:
    """(..., Tq, Tk+Tq-1) scores per distance -> (..., Tq, Tk) scores per key, by pad-and-reshape.

    Column c of x holds distance Tk-1-c (from Tk-1 down to -(Tq-1)). Query i (at position
    Tk-Tq+i) needs the window of columns starting at Tq-1-i. Put a zero column in front,
    read the rows as one flat line, drop its first Tq entries and read it back as rows of
    Tk+Tq-1: row i has moved left by exactly Tq-1-i. Every entry is exact, none is garbage.
    """
    *lead, t_q, n = x.shape
    flat = F.pad(x, (1, 0)).reshape(*lead, t_q * (n + 1))  # (..., Tq*(Tk+Tq)): zero column in front
    return flat[..., t_q:].reshape(*lead, t_q, n)[..., :t_k]  # (..., Tq, Tk)


class XLAttention(MultiHeadAttention):
    """Transformer-XL (Dai et al. 2019) relative attention: a new `score`, the rest inherited.

    Queries are aligned at the end of the keys (as in causal_mask): with M cached states in
    front of the segment, query i sits at position M+i and key j at position j. Then

        A_ij = q_i·k_j + q_i·r_{i-j} + u·k_j + v·r_{i-j}    (a) + (b) + (c) + (d), times the scale
        q_i = W_q x_i    k_j = W_kE x_j (the usual w_k)    r_{i-j} = W_kR R_{i-j} (w_r, no bias)

    (a) content addressing, (b) content-dependent position bias, (c) global content bias,
    (d) global position bias. R_d is a sinusoid of the distance d = i - j (the layout of
    sinusoidal_table; nothing learned, any distance), and the per-head vectors u and v take
    the place of the query's absolute position. The token embeddings carry no position.
    (a)+(c) = (q_i + u)·k_j is one matmul; (b)+(d) = (q_i + v)·r_d is one matmul over the
    Tk+Tq-1 distances, moved onto the (Tq, Tk) grid by rel_shift. `score_terms` computes
    the four terms one at a time, pair by pair, for the proofs.
    """

    def __init__(self, cfg: TransformerConfig):
        super().__init__(cfg)
        nh, hs = self.n_heads, self.d_head
        self.w_r = nn.Linear(cfg.d_model, cfg.d_model, bias=False)  # W_kR: keys of positions, apart from W_kE
        # N(0, 0.02) as in the authors' code; the models' _init_linear redraws them Xavier like every 2-D weight
        self.u = nn.Parameter(torch.randn(nh, hs) * 0.02)  # (nh, hs) global content bias, term (c)
        self.v = nn.Parameter(torch.randn(nh, hs) * 0.02)  # (nh, hs) global position bias, term (d)

    def sinusoids(self, dist: Tensor) -> Tensor:
        """(...) integer distances -> (..., C) R_dist: sin at even, cos at odd channels, as sinusoidal_table."""
        C = self.cfg.d_model
        inv_freq = 10000.0 ** (-torch.arange(0, C, 2, dtype=torch.float64, device=dist.device) / C)  # (C/2,)
        angle = dist.to(torch.float64)[..., None] * inv_freq  # (..., C/2)
        return torch.stack([angle.sin(), angle.cos()], dim=-1).flatten(-2)[..., :C].to(self.w_r.weight.dtype)

    def relative_keys(self, dist: Tensor) -> Tensor:
        """(...) distances -> (nh, ..., hs): r = W_kR R_dist, split into heads."""
        r = self.w_r(self.sinusoids(dist))  # (..., C)
        return r.view(*dist.shape, self.n_heads, self.d_head).movedim(-2, 0)  # (nh, ..., hs)

    def score(self, q: Tensor, k: Tensor) -> Tensor:
        t_q, t_k = q.shape[-2], k.shape[-2]
        dist = torch.arange(t_k - 1, -t_q, -1, device=q.device)  # (Tk+Tq-1,) every i-j: Tk-1 down to -(Tq-1)
        r = self.relative_keys(dist)  # (nh, Tk+Tq-1, hs)
        ac = (q + self.u[:, None]) @ k.transpose(-2, -1)  # (B, nh, Tq, Tk): (a) + (c)
        bd = (q + self.v[:, None]) @ r.transpose(-2, -1)  # (B, nh, Tq, Tk+Tq-1): (b) + (d), per distance
        return (ac + rel_shift(bd, t_k)) * self.scale  # (B, nh, Tq, Tk)

    def score_terms(self, q: Tensor, k: Tensor) -> dict[str, Tensor]:
        """The four terms, each (B, nh, Tq, Tk) and scaled, built pair by pair (no shift): they sum to score(q, k)."""
        B, nh, t_q, hs = q.shape
        t_k = k.shape[-2]
        i = torch.arange(t_q, device=q.device)[:, None] + (t_k - t_q)  # (Tq, 1) query positions
        j = torch.arange(t_k, device=q.device)[None, :]  # (1, Tk) key positions
        r = self.relative_keys(i - j)  # (nh, Tq, Tk, hs): r_{i-j} for every pair
        full = (B, nh, t_q, t_k)
        return {
            "a": (q @ k.transpose(-2, -1)) * self.scale,  # q_i·k_j
            "b": torch.einsum("bhid,hijd->bhij", q, r) * self.scale,  # q_i·r_{i-j}
            "c": (self.u[:, None] @ k.transpose(-2, -1)).expand(full) * self.scale,  # u·k_j
            "d": torch.einsum("hd,hijd->hij", self.v, r).expand(full) * self.scale,  # v·r_{i-j}
        }
# --8<-- [end:xl]


# --8<-- [start:additive]
class AdditiveAttention(MultiHeadAttention):
    """Additive attention (Bahdanau et al. 2015) per head, as a new `score`; the rest inherited.

        e_ij = v_h · tanh(q_i + k_j)      q_i = W_1 x_i (w_q), k_j = W_2 x_j (w_k), split into heads

    Bahdanau's W_1 and W_2 are the usual w_q and w_k; the one new parameter is v, one (hs,)
    vector per head. attn_scale does not apply to these logits: they are no dot product q·k,
    and |e_ij| <= ||v_h||_1 whatever d_k (the config refuses a non-default attn_scale, qk_norm
    and relative positions with score_fn="additive").

    Cost: q_i + k_j is formed for every pair, a (B, nh, Tq, Tk, hs) tensor with one tanh per
    element, kept for the backward pass. That tensor, hs times the (B, nh, Tq, Tk) score
    matrix that dot-product attention gets from one matmul, IS the cost of additive attention.
    `score` is overridden, so the fast path (F.scaled_dot_product_attention) is never used.
    """

    def __init__(self, cfg: TransformerConfig):
        super().__init__(cfg)
        # N(0, 1/hs): ||v_h||_2 ≈ 1, so Var(e_ij) <= ||v_h||_2^2 stays of order 1 at any head size.
        # The models' _init_linear redraws it Xavier like every 2-D weight (also ||v_h||_2 of order 1).
        self.v = nn.Parameter(torch.randn(self.n_heads, self.d_head) * self.d_head**-0.5)  # (nh, hs)

    def score(self, q: Tensor, k: Tensor) -> Tensor:
        """(B, nh, Tq, hs), (B, nh, Tk, hs) -> (B, nh, Tq, Tk) logits v_h · tanh(q_i + k_j), never scaled."""
        B, nh, Tq, _ = q.shape
        h = torch.tanh(q[:, :, :, None, :] + k[:, :, None, :, :])  # (B, nh, Tq, Tk, hs): every pair, every channel
        return (h.flatten(2, 3) @ self.v[:, :, None]).view(B, nh, Tq, -1)  # (B, nh, Tq·Tk, 1) -> (B, nh, Tq, Tk)
# --8<-- [end:additive]


# ----------------------------------------------------------------------------
# Sub-layers
# ----------------------------------------------------------------------------


class FeedForward(nn.Module):
    """FFN(x) = act(x W1 + b1) W2 + b2, the same weights at every position."""

    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.lin1 = nn.Linear(cfg.d_model, cfg.d_ff, bias=cfg.bias)
        self.lin2 = nn.Linear(cfg.d_ff, cfg.d_model, bias=cfg.bias)
        self.act = nn.ReLU() if cfg.activation == "relu" else nn.GELU()
        self.drop_ffn = nn.Dropout(cfg.dropout_ffn)

    def forward(self, x: Tensor) -> Tensor:
        return self.lin2(self.drop_ffn(self.act(self.lin1(x))))


class TokenBatchNorm(nn.BatchNorm1d):
    """BatchNorm over every token of the batch (B*T samples, C channels); padding tokens count too."""

    def forward(self, x: Tensor) -> Tensor:
        B, T, C = x.shape
        return super().forward(x.reshape(B * T, C)).view(B, T, C)


def make_norm(cfg: TransformerConfig) -> nn.Module:
    if cfg.norm == "layer":
        return nn.LayerNorm(cfg.d_model, eps=cfg.norm_eps)  # each token over its C features
    if cfg.norm == "batch":
        return TokenBatchNorm(cfg.d_model, eps=cfg.norm_eps)
    return nn.Identity()


class Residual(nn.Module):
    """One sub-layer connection: Post-LN norm(x + drop(f(x))) or Pre-LN x + drop(f(norm(x)))."""

    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.cfg = cfg
        self.norm = make_norm(cfg)
        self.drop_residual = nn.Dropout(cfg.dropout_residual)

    def forward(self, x: Tensor, f) -> Tensor:
        keep = x if self.cfg.residual else 0.0
        if self.cfg.norm_position == "pre":
            return keep + self.drop_residual(f(self.norm(x)))
        return self.norm(keep + self.drop_residual(f(x)))


def make_self_attention(cfg: TransformerConfig) -> MultiHeadAttention:
    """Self-attention for cfg.positions and cfg.score_fn: the variants override MultiHeadAttention.score/mix."""
    if cfg.score_fn == "additive":
        return AdditiveAttention(cfg)
    if cfg.positions == "shaw":
        return ShawAttention(cfg)
    if cfg.positions == "xl":
        return XLAttention(cfg)
    return MultiHeadAttention(cfg)


class EncoderLayer(nn.Module):
    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.self_attn = make_self_attention(cfg)
        self.ffn = FeedForward(cfg)
        self.sub_attn = Residual(cfg)
        self.sub_ffn = Residual(cfg)

    def forward(self, x: Tensor, key_padding_mask: Optional[Tensor] = None, causal: bool = False) -> Tensor:
        x = self.sub_attn(x, lambda h: self.self_attn(h, causal=causal, key_padding_mask=key_padding_mask))
        return self.sub_ffn(x, self.ffn)


class DecoderLayer(nn.Module):
    """Masked self-attention, then (if cross) attention over the encoder output, then the FFN."""

    def __init__(self, cfg: TransformerConfig, cross: bool = True):
        super().__init__()
        self.self_attn = make_self_attention(cfg)
        cross_cls = AdditiveAttention if cfg.score_fn == "additive" else MultiHeadAttention  # no positions here
        self.cross_attn = cross_cls(cfg) if cross else None
        self.ffn = FeedForward(cfg)
        self.sub_self = Residual(cfg)
        self.sub_cross = Residual(cfg) if cross else None
        self.sub_ffn = Residual(cfg)

    def forward(
        self,
        x: Tensor,
        memory: Optional[Tensor] = None,
        tgt_padding_mask: Optional[Tensor] = None,
        memory_padding_mask: Optional[Tensor] = None,
        mem: Optional[Tensor] = None,
        cache: Optional[dict] = None,
    ) -> Tensor:
        """memory: the encoder output (cross-attention). mem: (B, M, C) this layer's inputs over earlier
        segments (Transformer-XL recurrence), extra keys and values in front of x; queries come from x only.
        cache: {"self": {}, "cross": {}}, this layer's keys/values kept across decoding steps (Decoder.new_cache)."""
        self_cache, cross_cache = (None, None) if cache is None else (cache["self"], cache["cross"])
        x = self.sub_self(x, lambda h: self.self_attend(h, mem, tgt_padding_mask, self_cache))
        if self.cross_attn is not None:
            if memory is None:
                raise ConfigError("this decoder layer has cross-attention: pass the encoder output as memory.")
            x = self.sub_cross(
                x, lambda h: self.cross_attn(h, memory, key_padding_mask=memory_padding_mask, cache=cross_cache))
        return self.sub_ffn(x, self.ffn)

    def self_attend(
        self, h: Tensor, mem: Optional[Tensor], padding_mask: Optional[Tensor], cache: Optional[dict] = None
    ) -> Tensor:
        """Causal self-attention of h (B, T, C) over [mem ∘ h] (B, M+T, C); mem=None or M=0: over h alone
        (and over the keys/values of earlier steps when a cache is given)."""
        if mem is None or mem.shape[1] == 0:
            return self.self_attn(h, causal=True, key_padding_mask=padding_mask, cache=cache)
        if cache is not None:
            raise ConfigError("a key/value cache and Transformer-XL mems both prepend earlier positions: use one.")
        if self.sub_self.cfg.norm_position == "pre":
            mem = self.sub_self.norm(mem)  # Pre-LN: the cached inputs pass the same norm as h did
        kv = torch.cat([mem, h], dim=1)  # (B, M+T, C): keys/values from [SG(memory) ∘ h]
        if padding_mask is not None:  # (B, T) -> (B, M+T): cached states are never padding
            padding_mask = torch.cat([padding_mask.new_zeros(h.shape[0], mem.shape[1]), padding_mask], dim=1)
        return self.self_attn(h, kv, causal=True, key_padding_mask=padding_mask)  # causal_mask aligns h at the end


# ----------------------------------------------------------------------------
# Embeddings and stacks
# ----------------------------------------------------------------------------


class Embeddings(nn.Module):
    """Token embedding (x sqrt(d_model) if scale_embeddings) + position signal, then dropout."""

    def __init__(self, cfg: TransformerConfig, vocab_size: int):
        super().__init__()
        self.cfg = cfg
        self.vocab_size = vocab_size
        self.tok = nn.Embedding(vocab_size, cfg.d_model)
        std = cfg.d_model**-0.5 if cfg.emb_init == "normal_inv_sqrt_d" else 1.0
        nn.init.normal_(self.tok.weight, 0.0, std)
        self.pos = None
        if cfg.positions == "learned":
            self.pos = nn.Parameter(torch.randn(cfg.max_len, cfg.d_model) * cfg.learned_pos_std)  # (max_len, C)
        elif cfg.positions == "sinusoidal":
            self.register_buffer("pe", sinusoidal_table(cfg.max_len, cfg.d_model), persistent=False)
        self.drop_emb = nn.Dropout(cfg.dropout_emb)

    def positions(self, T: int, device=None, start: int = 0) -> Optional[Tensor]:
        """(T, C) position signal of positions start .. start+T-1 added to the embeddings, or None."""
        end = start + T
        if self.cfg.positions == "learned":
            if end > self.cfg.max_len:
                raise ConfigError(
                    f"sequence length {end} exceeds the learned position table (max_len={self.cfg.max_len}): a learned "
                    f"table has no row for position {self.cfg.max_len}. Raise max_len, or use positions='sinusoidal'."
                )
            return self.pos[start:end]
        if self.cfg.positions == "sinusoidal":
            table = self.pe if end <= self.pe.shape[0] else sinusoidal_table(end, self.cfg.d_model).to(device)
            return table[start:end]
        return None

    def forward(self, ids: Tensor, start: int = 0) -> Tensor:
        """ids (B, T) -> (B, T, C). start: the position of ids[:, 0] (incremental decoding feeds one token at a time)."""
        if not isinstance(ids, Tensor) or ids.dim() != 2 or ids.dtype not in (torch.long, torch.int32, torch.int64):
            got = f"{ids.dtype} {tuple(ids.shape)}" if isinstance(ids, Tensor) else type(ids).__name__
            raise ConfigError(f"expected token ids as an integer tensor of shape (batch, time), got {got}.")
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= self.vocab_size):
            raise ConfigError(
                f"token ids must lie in [0, {self.vocab_size}); got values in [{int(ids.min())}, {int(ids.max())}]. "
                f"Raise vocab_size or fix the tokenizer."
            )
        x = self.tok(ids)  # (B, T, C)
        if self.cfg.scale_embeddings:
            x = x * math.sqrt(self.cfg.d_model)
        pe = self.positions(ids.shape[1], ids.device, start)
        if pe is not None:
            x = x + pe
        return self.drop_emb(x)


class Encoder(nn.Module):
    def __init__(self, cfg: TransformerConfig, n_layers: Optional[int] = None):
        super().__init__()
        self.cfg = cfg
        self.layers = nn.ModuleList(EncoderLayer(cfg) for _ in range(n_layers or cfg.n_layers))
        self.final_norm = make_norm(cfg) if cfg.norm_position == "pre" else nn.Identity()  # Pre-LN's last norm

    def forward(self, x: Tensor, key_padding_mask: Optional[Tensor] = None, causal: bool = False) -> Tensor:
        for layer in self.layers:
            x = layer(x, key_padding_mask, causal)
        return self.final_norm(x)


class Decoder(nn.Module):
    def __init__(self, cfg: TransformerConfig, cross: bool = True):
        super().__init__()
        self.cfg = cfg
        n = cfg.n_dec_layers or cfg.n_layers
        self.layers = nn.ModuleList(DecoderLayer(cfg, cross) for _ in range(n))
        self.final_norm = make_norm(cfg) if cfg.norm_position == "pre" else nn.Identity()

    def forward(self, x, memory=None, tgt_padding_mask=None, memory_padding_mask=None, mems=None, cache=None) -> Tensor:
        """cache: new_cache(), kept across steps; x then holds only the positions not yet cached."""
        if cache is None:
            return self.forward_with_memory(x, mems, None, memory, tgt_padding_mask, memory_padding_mask)[0]
        if mems is not None or tgt_padding_mask is not None or len(cache) != len(self.layers):
            raise ConfigError(
                f"with a key/value cache pass no mems and no tgt_padding_mask (generation runs unpadded), and one "
                f"cache entry per layer ({len(self.layers)}, got {len(cache)}): use Decoder.new_cache()."
            )
        for layer, layer_cache in zip(self.layers, cache):
            x = layer(x, memory, None, memory_padding_mask, cache=layer_cache)
        return self.final_norm(x)

    def new_cache(self) -> list[dict]:
        """The state of incremental decoding: per layer, the self- and cross-attention keys/values so far."""
        return [{"self": {}, "cross": {}} for _ in self.layers]

    def forward_with_memory(
        self, x, mems=None, mem_len=None, memory=None, tgt_padding_mask=None, memory_padding_mask=None
    ) -> tuple[Tensor, list[Tensor]]:
        """Transformer-XL segment recurrence: the output and the mems for the next segment.

        mems: None or one (B, M, C) tensor per layer, that layer's inputs over earlier segments.
        New mems: each layer's input appended to its old memory, cut to the last mem_len positions
        (default cfg.mem_len; a larger value at evaluation lets the memory grow) and detached:
        the next segment reads them, but no gradient flows back into this one.
        """
        mem_len = self.cfg.mem_len if mem_len is None else mem_len
        if mem_len < 0:
            raise ConfigError(f"mem_len={mem_len} must be >= 0 (0 keeps no memory).")
        if mems is not None and (len(mems) != len(self.layers) or any(
                m.dim() != 3 or m.shape[0] != x.shape[0] or m.shape[2] != x.shape[2] for m in mems)):
            raise ConfigError(
                f"mems must hold one (batch={x.shape[0]}, M, d_model={x.shape[2]}) tensor per layer ({len(self.layers)}), "
                f"got {[tuple(m.shape) for m in mems]}; pass the new_mems the previous segment returned."
            )
        # --8<-- [start:xl_recurrence]
        new_mems = []
        for layer, mem in zip(self.layers, mems or [None] * len(self.layers)):
            states = x if mem is None else torch.cat([mem, x], dim=1)  # (B, M+T, C) this layer's inputs so far
            new_mems.append(states[:, max(states.shape[1] - mem_len, 0):].detach())  # (B, ≤mem_len, C), SG
            x = layer(x, memory, tgt_padding_mask, memory_padding_mask, mem)  # keys/values over [mem ∘ x]
        return self.final_norm(x), new_mems
        # --8<-- [end:xl_recurrence]


class _Head(nn.Module):
    """Pre-softmax projection: logits = h E^T (tied to an embedding) or an independent linear map."""

    def __init__(self, cfg: TransformerConfig, vocab_size: int, tied_to: Optional[nn.Embedding]):
        super().__init__()
        self.tied_to = tied_to
        self.proj = None if tied_to is not None else nn.Linear(cfg.d_model, vocab_size, bias=False)

    def forward(self, h: Tensor) -> Tensor:
        if self.tied_to is not None:
            return h @ self.tied_to.weight.t()  # (B, T, V)
        return self.proj(h)


def _init_linear(model: nn.Module) -> None:
    """Xavier-uniform for every matrix of the layers (as in the Annotated Transformer and fairseq)."""
    for name, p in model.named_parameters():
        if p.dim() == 2 and ".tok." not in f".{name}" and not name.endswith("pos"):
            nn.init.xavier_uniform_(p)


class EncoderTagger(nn.Module):
    """Encoder-only model that predicts one token per input position (copy, reverse, previous-token ...)."""

    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.cfg = cfg
        self.embed = Embeddings(cfg, cfg.vocab_size)
        self.encoder = Encoder(cfg)
        tie = cfg.tie_embeddings != "none"
        self.head = _Head(cfg, cfg.vocab_size, self.embed.tok if tie else None)
        _init_linear(self)

    def forward(self, ids: Tensor, key_padding_mask: Optional[Tensor] = None) -> Tensor:
        return self.head(self.encoder(self.embed(ids), key_padding_mask))  # (B, T, V)


class DecoderLM(nn.Module):
    """Decoder-only language model: causal self-attention layers, no cross-attention."""

    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.cfg = cfg
        self.embed = Embeddings(cfg, cfg.vocab_size)
        self.decoder = Decoder(cfg, cross=False)
        tie = cfg.tie_embeddings != "none"
        self.head = _Head(cfg, cfg.vocab_size, self.embed.tok if tie else None)
        _init_linear(self)

    def forward(self, ids: Tensor, padding_mask: Optional[Tensor] = None, mems: Optional[list] = None) -> Tensor:
        return self.head(self.decoder(self.embed(ids), tgt_padding_mask=padding_mask, mems=mems))  # (B, T, V)

    def forward_with_memory(
        self, ids: Tensor, mems: Optional[list] = None, mem_len: Optional[int] = None, padding_mask=None
    ) -> tuple[Tensor, list[Tensor]]:
        """One segment of a longer text: (B, T, V) logits and the detached mems for the next (see Decoder)."""
        h, new_mems = self.decoder.forward_with_memory(self.embed(ids), mems, mem_len, tgt_padding_mask=padding_mask)
        return self.head(h), new_mems

    # --8<-- [start:generate_lm]
    @torch.no_grad()
    def generate(self, ids: Tensor, steps: int, use_cache: bool = True) -> tuple[Tensor, Tensor]:
        """Greedy continuation of the prompt ids (B, T) by `steps` tokens (call .eval() first).

        With the cache each step feeds the decoder only the tokens it has not seen, at their
        positions; without it each step reruns the whole prefix. Returns (B, T+steps) ids and
        the (B, steps, V) logits each token was picked from.
        """
        cache = self.decoder.new_cache() if use_cache else None

        def last_logits(ids: Tensor, n_new: int) -> Tensor:
            if cache is None:
                return self(ids)[:, -1]  # (B, V): every position recomputed
            start = ids.shape[1] - n_new  # position of the first token not yet cached
            return self.head(self.decoder(self.embed(ids[:, start:], start), cache=cache)[:, -1])

        return greedy(last_logits, ids, steps)
    # --8<-- [end:generate_lm]


class EncoderDecoder(nn.Module):
    """The 2017 model: encoder over the source, decoder with cross-attention over the encoder output."""

    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.cfg = cfg
        self.tgt_embed = Embeddings(cfg, cfg.vocab_size)
        self.src_embed = Embeddings(cfg, cfg.src_vocab_size or cfg.vocab_size)
        if cfg.tie_embeddings == "all":
            self.src_embed.tok = self.tgt_embed.tok  # one matrix for both embeddings (and the head below)
        self.encoder = Encoder(cfg)
        self.decoder = Decoder(cfg, cross=True)
        tie = cfg.tie_embeddings != "none"
        self.head = _Head(cfg, cfg.vocab_size, self.tgt_embed.tok if tie else None)
        _init_linear(self)

    def encode(self, src: Tensor, src_padding_mask: Optional[Tensor] = None) -> Tensor:
        return self.encoder(self.src_embed(src), src_padding_mask)

    def decode(self, tgt_in: Tensor, memory: Tensor, tgt_padding_mask=None, src_padding_mask=None) -> Tensor:
        return self.head(self.decoder(self.tgt_embed(tgt_in), memory, tgt_padding_mask, src_padding_mask))

    def forward(self, src: Tensor, tgt_in: Tensor, src_padding_mask=None, tgt_padding_mask=None) -> Tensor:
        """tgt_in is the target shifted right (teacher forcing); returns (B, T_tgt, V) logits."""
        return self.decode(tgt_in, self.encode(src, src_padding_mask), tgt_padding_mask, src_padding_mask)

    # --8<-- [start:generate_seq2seq]
    @torch.no_grad()
    def generate(self, src: Tensor, bos: int, steps: int, use_cache: bool = True,
                 src_padding_mask: Optional[Tensor] = None) -> tuple[Tensor, Tensor]:
        """Greedy translation of src (B, S) (call .eval() first): the encoder runs once, the decoder once per token.

        Returns (B, 1+steps) ids starting with bos and the (B, steps, V) logits each token was picked from.
        With the cache, cross-attention projects the encoder output to keys/values once.
        """
        memory = self.encode(src, src_padding_mask)  # (B, S, C), read by every step and every decoder layer
        cache = self.decoder.new_cache() if use_cache else None

        def last_logits(ids: Tensor, n_new: int) -> Tensor:
            if cache is None:
                return self.decode(ids, memory, None, src_padding_mask)[:, -1]  # (B, V): whole prefix again
            start = ids.shape[1] - n_new
            h = self.decoder(self.tgt_embed(ids[:, start:], start), memory, None, src_padding_mask, cache=cache)
            return self.head(h[:, -1])

        return greedy(last_logits, torch.full((src.shape[0], 1), bos, dtype=torch.long, device=src.device), steps)
    # --8<-- [end:generate_seq2seq]


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
