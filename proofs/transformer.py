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
from typing import Iterator, Literal, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

__all__ = [
    "TransformerConfig",
    "ConfigError",
    "MultiHeadAttention",
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
]


class ConfigError(ValueError):
    """A configuration or input that the model cannot use; the message says how to fix it."""


# Allowed values of the string-valued switches, checked in __post_init__.
_CHOICES = {
    "attn_scale": ("sqrt_dk", "none", "dk"),
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
    qk_norm: str = "none"  # "layer": LayerNorm each head's q and k over d_k before the dot product (QK-norm)
    share_qk: bool = False  # use one matrix for W_Q and W_K (makes the score matrix symmetric)
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
        self.w_q = nn.Linear(C, C, bias=cfg.bias)
        self.w_k = None if cfg.share_qk else nn.Linear(C, C, bias=cfg.bias)  # share_qk: keys use w_q
        self.w_v = nn.Linear(C, C, bias=cfg.bias)
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

    def forward(
        self,
        x: Tensor,
        kv: Optional[Tensor] = None,
        *,
        causal: bool = False,
        key_padding_mask: Optional[Tensor] = None,
        attn_mask: Optional[Tensor] = None,
    ) -> Tensor:
        """x: (B, Tq, C) queries; kv: (B, Tk, C) keys/values (x itself for self-attention).

        key_padding_mask: (B, Tk) bool, True at padding. attn_mask: (Tq, Tk) or (B, Tq, Tk) bool,
        True where query i must not see key j. causal: hide keys after each query.
        """
        kv = x if kv is None else kv
        if x.dim() != 3 or x.shape[-1] != self.cfg.d_model or kv.dim() != 3 or kv.shape[-1] != self.cfg.d_model:
            raise ConfigError(
                f"attention expects (batch, time, d_model={self.cfg.d_model}) inputs, got {tuple(x.shape)} and "
                f"{tuple(kv.shape)}; embed token ids first or check d_model."
            )
        B, Tq, _ = x.shape
        Tk = kv.shape[1]
        _check_mask(key_padding_mask, "key_padding_mask", [(B, Tk)], "batch, key length")
        _check_mask(attn_mask, "attn_mask", [(Tq, Tk), (B, Tq, Tk)], "query length, key length")
        q, k, v = self.project(x, kv)

        hide = None  # (B or 1, 1, Tq, Tk) bool
        if causal:
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


class ShawAttention(MultiHeadAttention):
    """Shaw et al. (2018) relative position representations: see issue 4 (being implemented)."""

    def __init__(self, cfg: TransformerConfig):
        raise NotImplementedError("positions='shaw' is not implemented yet")


class XLAttention(MultiHeadAttention):
    """Transformer-XL (Dai et al. 2019) relative attention with segment memory: being implemented."""

    def __init__(self, cfg: TransformerConfig):
        raise NotImplementedError("positions='xl' is not implemented yet")


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
    """Self-attention for cfg.positions: relative variants override MultiHeadAttention.score/mix."""
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
        self.cross_attn = MultiHeadAttention(cfg) if cross else None
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
    ) -> Tensor:
        x = self.sub_self(x, lambda h: self.self_attn(h, causal=True, key_padding_mask=tgt_padding_mask))
        if self.cross_attn is not None:
            if memory is None:
                raise ConfigError("this decoder layer has cross-attention: pass the encoder output as memory.")
            x = self.sub_cross(x, lambda h: self.cross_attn(h, memory, key_padding_mask=memory_padding_mask))
        return self.sub_ffn(x, self.ffn)


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

    def positions(self, T: int, device=None) -> Optional[Tensor]:
        """(T, C) position signal added to the embeddings, or None."""
        if self.cfg.positions == "learned":
            if T > self.cfg.max_len:
                raise ConfigError(
                    f"sequence length {T} exceeds the learned position table (max_len={self.cfg.max_len}): a learned "
                    f"table has no row for position {self.cfg.max_len}. Raise max_len, or use positions='sinusoidal'."
                )
            return self.pos[:T]
        if self.cfg.positions == "sinusoidal":
            return self.pe[:T] if T <= self.pe.shape[0] else sinusoidal_table(T, self.cfg.d_model).to(device)
        return None

    def forward(self, ids: Tensor) -> Tensor:
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
        pe = self.positions(ids.shape[1], ids.device)
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
        n = cfg.n_dec_layers or cfg.n_layers
        self.layers = nn.ModuleList(DecoderLayer(cfg, cross) for _ in range(n))
        self.final_norm = make_norm(cfg) if cfg.norm_position == "pre" else nn.Identity()

    def forward(self, x, memory=None, tgt_padding_mask=None, memory_padding_mask=None) -> Tensor:
        for layer in self.layers:
            x = layer(x, memory, tgt_padding_mask, memory_padding_mask)
        return self.final_norm(x)


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

    def forward(self, ids: Tensor, padding_mask: Optional[Tensor] = None) -> Tensor:
        return self.head(self.decoder(self.embed(ids), tgt_padding_mask=padding_mask))  # (B, T, V)


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
