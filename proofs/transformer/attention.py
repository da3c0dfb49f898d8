"""Multi-head attention: the one class every attention variant subclasses, and its three implementations.

    project_q / project_kv    queries; keys and values (n_kv_heads of them: MHA, GQA or MQA)
    place                     where positions enter q and k (rotary variants override it)
    score, bias, mix          the overridable pieces: logits, an additive position bias, the weighted sum
    forward                   masks from positions (causal, window, prefix, padding), then one of
                              explicit softmax(QKᵀ) (weights readable), F.scaled_dot_product_attention, or
                              `tiled_attention`: FlashAttention's online softmax over blocks

Positions are explicit: q_pos (B|1, Tq) and k_pos (B|1, Tk) integer tensors, k_pos = -1 marking an empty
cache slot. Without a cache, queries are aligned at the end of the keys (as in causal_mask).
Mask convention (as in torch.nn): a bool tensor where True marks a position that must NOT be attended to.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Iterator, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from .config import ConfigError, TransformerConfig
from .norms import make_norm

Pos = tuple[Tensor, Tensor]  # (q_pos (B|1, Tq), k_pos (B|1, Tk)) long


def causal_mask(t_q: int, t_k: Optional[int] = None, device=None) -> Tensor:
    """(Tq, Tk) bool, True above the diagonal: query i may not see key j > i (aligned at the end)."""
    t_k = t_q if t_k is None else t_k
    i = torch.arange(t_q, device=device)[:, None] + (t_k - t_q)
    j = torch.arange(t_k, device=device)[None, :]
    return j > i


def end_aligned(t_q: int, t_k: int, device=None) -> Pos:
    """Positions of t_q queries that sit at the end of t_k keys: ((1, Tq), (1, Tk))."""
    return torch.arange(t_k - t_q, t_k, device=device)[None], torch.arange(t_k, device=device)[None]


# --8<-- [start:hidden]
def hidden(q_pos: Tensor, k_pos: Tensor, causal: bool, window: int = 0, sinks: int = 0,
           prefix: int = 0) -> Optional[Tensor]:
    """(B|1, 1, Tq, Tk) bool, True where query i must not see key j, from their positions alone.

    causal: keys after the query are hidden, except keys inside a prefix of `prefix` positions (prefix LM).
    window: a causal query sees itself and the window-1 keys before it (bidirectional: |i - j| < window);
    the first `sinks` positions stay visible to every query (attention sinks). k_pos < 0: an empty slot.
    """
    q, k = q_pos[:, :, None], k_pos[:, None, :]  # (B|1, Tq, 1), (B|1, 1, Tk)
    hide = (k < 0).expand(-1, q.shape[1], -1)
    if causal:
        hide = hide | ((k > q) & (k >= prefix))
    if window:
        far = (q - k >= window) if causal else ((q - k).abs() >= window)
        hide = hide | (far & (k >= sinks))
    return hide[:, None]
# --8<-- [end:hidden]


def check_mask(mask: Optional[Tensor], name: str, allowed: list[tuple[int, ...]], hint: str) -> None:
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


def repeat_kv(x: Tensor, n_rep: int) -> Tensor:
    """(B, n_kv, T, hs) -> (B, n_kv·n_rep, T, hs): query head h reads key/value head h // n_rep (GQA)."""
    if n_rep == 1:
        return x
    B, n_kv, T, hs = x.shape
    return x[:, :, None].expand(B, n_kv, n_rep, T, hs).reshape(B, n_kv * n_rep, T, hs)


# --8<-- [start:tiled]
def tiled_attention(q: Tensor, k: Tensor, v: Tensor, scale, block: int,
                    hide: Callable[[slice, slice], Optional[Tensor]],
                    bias: Callable[[slice, slice], Optional[Tensor]] = lambda i, j: None) -> Tensor:
    """softmax(q kᵀ·scale + bias, masked) v, one (block × block) tile of scores at a time (Dao et al. 2022, Alg. 1).

    q (B, nh, Tq, d), k (B, nh, Tk, d), v (B, nh, Tk, dv). hide(i, j) / bias(i, j) give the mask / bias
    of query rows i and key columns j. Per query block it keeps a running max m, a running sum l of
    exp(s - m) and an unnormalised output acc; a new key block with a larger max rescales the earlier
    ones by exp(m_old - m_new). No (Tq, Tk) tensor is ever built; the result equals the full softmax.
    Half-precision inputs are accumulated in float32 tile by tile (m, l, acc), as FlashAttention's kernels do.
    """
    B, nh, t_q, _ = q.shape
    t_k, dv = k.shape[2], v.shape[-1]
    acc_dtype = torch.float32 if q.dtype in (torch.float16, torch.bfloat16) else q.dtype
    out = q.new_empty(B, nh, t_q, dv)
    for i0 in range(0, t_q, block):
        i = slice(i0, min(i0 + block, t_q))
        qi = q[:, :, i].to(acc_dtype)  # (B, nh, bq, d)
        m = qi.new_full((B, nh, qi.shape[2], 1), float("-inf"))  # running max of each row
        l = qi.new_zeros(B, nh, qi.shape[2], 1)  # running sum of exp(s - m)
        acc = qi.new_zeros(B, nh, qi.shape[2], dv)  # running sum of exp(s - m) v
        for j0 in range(0, t_k, block):
            j = slice(j0, min(j0 + block, t_k))
            s = (qi @ k[:, :, j].to(acc_dtype).transpose(-2, -1)) * scale  # (B, nh, bq, bk): one tile of scores
            b = bias(i, j)
            s = s if b is None else s + b
            h = hide(i, j)
            s = s if h is None else s.masked_fill(h, float("-inf"))
            m_new = torch.maximum(m, s.amax(-1, keepdim=True))
            m_safe = m_new.masked_fill(m_new == float("-inf"), 0.0)  # rows with nothing visible yet
            p = torch.exp(s - m_safe)  # (B, nh, bq, bk)
            rescale = torch.exp(m - m_safe)  # shrinks what earlier blocks summed under a smaller max
            l = l * rescale + p.sum(-1, keepdim=True)
            acc = acc * rescale + p @ v[:, :, j].to(acc_dtype)
            m = m_new
        out[:, :, i] = (acc / l).to(out.dtype)
    return out
# --8<-- [end:tiled]


class MultiHeadAttention(nn.Module):
    """Scaled dot-product attention with n_heads query heads and n_kv_heads key/value heads.

    `score` is the method a relative-position variant overrides (labml's get_scores hook): it maps
    queries and keys to the logits that the mask and softmax are applied to. `bias` adds a position
    bias (ALiBi, T5) that the fused and tiled paths can take as well; `place` rotates q and k (RoPE);
    `mix` maps the weights and values to the heads' outputs.
    """

    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.cfg = cfg
        C, nh, hs = cfg.d_model, cfg.n_heads, cfg.d_head
        self.n_heads, self.n_kv, self.d_head = nh, cfg.kv_heads, hs
        kv_width = self.n_kv * hs
        bias = cfg.bias if cfg.attn_bias is None else cfg.attn_bias
        if cfg.qkv_proj:
            self.w_q = nn.Linear(C, C, bias=bias)
            self.w_k = None if cfg.share_qk else nn.Linear(C, kv_width, bias=bias)  # share_qk: keys use w_q
            self.w_v = nn.Linear(C, kv_width, bias=bias)
        else:  # qkv_proj=False: q = k = v = x
            self.w_q, self.w_k, self.w_v = nn.Identity(), nn.Identity(), nn.Identity()
        self.w_o = nn.Linear(C, C, bias=bias)
        self.q_norm = make_norm(cfg.qk_norm, hs, cfg.norm_eps)
        self.k_norm = make_norm(cfg.qk_norm, hs, cfg.norm_eps)
        self.drop_attn = nn.Dropout(cfg.dropout_attn)
        if cfg.attn_impl == "tiled" and cfg.dropout_attn > 0:
            raise ConfigError(
                f"attn_impl='tiled' never forms the attention weights, so dropout_attn={cfg.dropout_attn} would be "
                f"skipped silently. Set dropout_attn=0 or use attn_impl='explicit' (or 'auto')."
            )
        if cfg.attn_scale == "learned":  # one temperature per head, starting at 1/sqrt(d_k)
            self.scale = nn.Parameter(torch.full((nh, 1, 1), hs**-0.5))
        else:
            self.scale = {"sqrt_dk": hs**-0.5, "none": 1.0, "dk": 1.0 / hs}[cfg.attn_scale]
        self.record = False  # set by record_attention(): keep the last softmax weights in .weights
        self.weights: Optional[Tensor] = None  # (B, nh, Tq, Tk) from the last explicit-path call
        self.causal = False  # of the current call, for bias() (T5 buckets depend on it)

    # -- the overridable pieces ---------------------------------------------------
    def score(self, q: Tensor, k: Tensor, pos: Optional[Pos] = None) -> Tensor:
        """(B, nh, Tq, hs), (B, nh, Tk, hs) -> (B, nh, Tq, Tk) scaled logits."""
        return (q @ k.transpose(-2, -1)) * self.scale

    def bias(self, q_pos: Tensor, k_pos: Tensor) -> Optional[Tensor]:
        """A position bias added to the logits, (B|1, nh, Tq, Tk), or None (none here)."""
        return None

    def mix(self, attn: Tensor, v: Tensor, pos: Optional[Pos] = None) -> Tensor:
        """(B, nh, Tq, Tk), (B, nh, Tk, hs) -> (B, nh, Tq, hs)."""
        return attn @ v

    def place(self, q: Tensor, kv: tuple[Tensor, ...], q_pos: Tensor, k_pos: Tensor) -> tuple[Tensor, tuple]:
        """Put positions into the new queries and keys before keys are cached (rotary variants); identity here."""
        return q, kv

    # -- projections --------------------------------------------------------------
    def _heads(self, x: Tensor, n: Optional[int] = None) -> Tensor:
        B, T, _ = x.shape
        return x.view(B, T, n or self.n_heads, self.d_head).transpose(1, 2)  # (B, n, T, hs)

    def project_q(self, x: Tensor) -> Tensor:
        return self.q_norm(self._heads(self.w_q(x)))  # (B, nh, Tq, hs)

    def project_kv(self, kv: Tensor) -> tuple[Tensor, ...]:
        """What a cache keeps per token: here keys and values, (B, n_kv, Tk, hs) each."""
        k = self._heads((self.w_q if self.w_k is None else self.w_k)(kv), self.n_kv)  # (B, n_kv, Tk, hs)
        v = self._heads(self.w_v(kv), self.n_kv)  # (B, n_kv, Tk, hs)
        return self.k_norm(k), v

    def keys_values(self, kv: tuple[Tensor, ...]) -> tuple[Tensor, Tensor]:
        """Cached entries -> the keys and values every query head reads, (B, nh, Tk, hs) each."""
        k, v = kv
        rep = self.n_heads // self.n_kv
        return repeat_kv(k, rep), repeat_kv(v, rep)

    def project(self, x: Tensor, kv: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Queries from x, keys and values from kv, one per query head (no positions, no cache): for the proofs."""
        return (self.project_q(x), *self.keys_values(self.project_kv(kv)))

    def uses_fast_path(self) -> bool:
        """True when F.scaled_dot_product_attention computes exactly what the explicit path would."""
        return (
            self.cfg.attn_impl == "auto"
            and not self.record
            and type(self).score is MultiHeadAttention.score
            and type(self).mix is MultiHeadAttention.mix
            and not (self.training and self.drop_attn.p > 0)  # keep attention dropout a visible module
            and self.cfg.mask_fill == "-inf"
        )

    def forward(
        self,
        x: Tensor,
        kv: Optional[Tensor] = None,
        *,
        causal: bool = False,
        key_padding_mask: Optional[Tensor] = None,
        attn_mask: Optional[Tensor] = None,
        cache=None,
        positions: Optional[Tensor] = None,
        prefix: int = 0,
    ) -> Tensor:
        """x: (B, Tq, C) queries; kv: (B, Tk, C) keys/values (x itself for self-attention).

        key_padding_mask: (B, Tk) bool, True at padding. attn_mask: (Tq, Tk) or (B, Tq, Tk) bool,
        True where query i must not see key j. causal: hide keys after each query (window, sinks and
        prefix from the config and `prefix` refine it). cache: a KVCache (see cache.py) kept across the
        steps of incremental decoding; Tk then counts every cached key, and the masks must cover them.
        positions: (B, Tq) positions of the queries (default: after the cached ones, or end-aligned).
        """
        self_attention = kv is None
        kv = x if kv is None else kv
        C = self.cfg.d_model
        if x.dim() != 3 or x.shape[-1] != C or kv.dim() != 3 or kv.shape[-1] != C:
            raise ConfigError(
                f"attention expects (batch, time, d_model={C}) inputs, got {tuple(x.shape)} and "
                f"{tuple(kv.shape)}; embed token ids first or check d_model."
            )
        if cache is not None and not hasattr(cache, "update"):
            raise ConfigError(f"cache must be a KVCache (or a rolling or paged one) from Decoder.new_cache(), got "
                              f"{type(cache).__name__}: start each generation with a fresh one.")
        B, Tq, _ = x.shape
        q = self.project_q(x)  # (B, nh, Tq, hs)
        if cache is not None and not self_attention and cache.filled:
            entries, k_pos = cache.entries, cache.pos  # cross-attention: the encoder's keys/values, projected once
            q_pos = torch.zeros(1, Tq, dtype=torch.long, device=x.device)  # unused: no causal mask across the two
        else:
            entries = self.project_kv(kv)  # (B, n_kv, Tk_new, hs) each
            if self_attention and (cache is not None or positions is not None):
                q_pos = cache.next_positions(B, Tq, x.device) if positions is None else positions  # (B, Tq)
                new_pos = q_pos  # the new keys are the new tokens
            else:
                q_pos, new_pos = end_aligned(Tq, kv.shape[1], x.device)
            q, entries = self.place(q, entries, q_pos, new_pos)
            entries, k_pos = (entries, new_pos) if cache is None else cache.update(entries, new_pos)
        k, v = self.keys_values(entries)  # (B, nh, Tk, hs) each
        Tk = k.shape[2]
        check_mask(key_padding_mask, "key_padding_mask", [(B, Tk)], "batch, key length")
        check_mask(attn_mask, "attn_mask", [(Tq, Tk), (B, Tq, Tk)], "query length, key length")
        window = self.cfg.window if (causal or self_attention) else 0  # never across encoder and decoder
        self.causal = causal
        empty = getattr(cache, "has_gaps", False)  # a paged cache pads shorter rows with empty slots

        def hide_of(i: slice = slice(None), j: slice = slice(None)) -> Optional[Tensor]:
            """(B|1, 1, bq, bk) bool mask of query rows i and key columns j."""
            h = None
            if causal or window or prefix or empty:
                h = hidden(q_pos[:, i], k_pos[:, j], causal, window, self.cfg.attn_sinks, prefix)
            if attn_mask is not None:
                m = (attn_mask if attn_mask.dim() == 3 else attn_mask[None])[:, None, i, j]
                h = m if h is None else h | m
            if key_padding_mask is not None:
                m = key_padding_mask[:, None, None, j]
                h = m if h is None else h | m
            return h

        def bias_of(i: slice = slice(None), j: slice = slice(None)) -> Optional[Tensor]:
            return self.bias(q_pos[:, i], k_pos[:, j])

        if self.cfg.attn_impl == "tiled" and not self.record:  # the config admits only the base score and mix here
            y = tiled_attention(q, k, v, self.scale, self.cfg.attn_block, hide_of, bias_of)
        elif self.uses_fast_path():
            hide, b = hide_of(), bias_of()
            mask = None if hide is None else ~hide
            if b is not None:  # a float mask carries the bias; hidden entries get -inf
                mask = b.expand(B, -1, Tq, Tk) if hide is None else b.masked_fill(hide, float("-inf"))
            scale = self.scale
            if isinstance(scale, Tensor):  # a learned per-head scale goes into q; SDPA takes one float
                q, scale = q * scale, 1.0
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
        else:
            pos = (q_pos, k_pos)
            s = self.score(q, k, pos)  # (B, nh, Tq, Tk)
            b = bias_of()
            if b is not None:
                s = s + b
            hide = hide_of()
            if hide is not None:
                fill = float("-inf") if self.cfg.mask_fill == "-inf" else torch.finfo(s.dtype).min
                s = s.masked_fill(hide, fill)
            a = self.drop_attn(torch.softmax(s, dim=-1))
            if self.record:
                self.weights = a.detach()
            y = self.mix(a, v, pos)  # (B, nh, Tq, hs)
        y = y.transpose(1, 2).reshape(B, Tq, -1)  # (B, Tq, nh·hs)
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
