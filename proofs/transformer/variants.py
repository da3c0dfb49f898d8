"""Attention variants: each overrides one or two of MultiHeadAttention's pieces, never the rest.

    AdditiveAttention   score: v·tanh(q + k) per head (Bahdanau et al. 2015)
    ShawAttention       score and mix: clipped relative vectors on keys and values (Shaw et al. 2018)
    XLAttention         score: the four-term relative score with rel_shift (Dai et al. 2019)
    RotaryAttention     place: rotate q and k by their positions (Su et al. 2021), both pair layouts
    ALiBiAttention      bias: -slope_h·|i - j| (Press et al. 2022)
    T5BiasAttention     bias: one learned scalar per head and offset bucket (Raffel et al. 2020)

`make_self_attention(cfg)` picks the class for cfg.positions / cfg.score_fn / cfg.kv_latent.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from .attention import MultiHeadAttention, Pos, end_aligned
from .config import TransformerConfig
from .positions import alibi_slopes, apply_rope, rope_attention_factor, rope_cos_sin, rope_inv_freq, t5_bucket


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

    def rel_index(self, t_q: int, t_k: int, device=None, pos: Optional[Pos] = None) -> Tensor:
        """(B|1, 1, Tq, Tk) long: table row clip(j - i, -k, k) + k of each pair (default: queries end-aligned)."""
        q_pos, k_pos = end_aligned(t_q, t_k, device) if pos is None else pos
        k = self.cfg.rel_clip
        return ((k_pos[:, None, :] - q_pos[:, :, None]).clamp(-k, k) + k)[:, None]

    def score(self, q: Tensor, k: Tensor, pos: Optional[Pos] = None) -> Tensor:
        B, nh, Tq, hs = q.shape
        idx = self.rel_index(Tq, k.shape[2], q.device, pos).expand(B, nh, -1, -1)  # (B, nh, Tq, Tk)
        content = q @ k.transpose(-2, -1)  # (B, nh, Tq, Tk): q_i · k_j
        q_rows = q @ self.rel_k.transpose(-2, -1)  # (B, nh, Tq, 2k+1): q_i · w^K_r for every row r
        position = q_rows.gather(-1, idx)  # (B, nh, Tq, Tk): q_i · a^K_ij
        return (content + position) * self.scale

    def mix(self, attn: Tensor, v: Tensor, pos: Optional[Pos] = None) -> Tensor:
        y = attn @ v  # (B, nh, Tq, hs): Σ_j α_ij v_j
        if self.rel_v is None:
            return y
        B, nh, Tq, Tk = attn.shape
        idx = self.rel_index(Tq, Tk, attn.device, pos).expand(B, nh, -1, -1)  # (B, nh, Tq, Tk)
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

    def score(self, q: Tensor, k: Tensor, pos: Optional[Pos] = None) -> Tensor:
        """Queries end-aligned on contiguous keys (the rel-shift needs it): `pos` is not read."""
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

    def score(self, q: Tensor, k: Tensor, pos: Optional[Pos] = None) -> Tensor:
        """(B, nh, Tq, hs), (B, nh, Tk, hs) -> (B, nh, Tq, Tk) logits v_h · tanh(q_i + k_j), never scaled."""
        B, nh, Tq, _ = q.shape
        h = torch.tanh(q[:, :, :, None, :] + k[:, :, None, :, :])  # (B, nh, Tq, Tk, hs): every pair, every channel
        return (h.flatten(2, 3) @ self.v[:, :, None]).view(B, nh, Tq, -1)  # (B, nh, Tq·Tk, 1) -> (B, nh, Tq, Tk)
# --8<-- [end:additive]


# ----------------------------------------------------------------------------


# --8<-- [start:rope]
class RotaryAttention(MultiHeadAttention):
    """RoPE (Su et al. 2021): rotate every pair of q's and k's channels by position·theta_i, so that
    q_m·k_n = Re[Σ_i q̃_i conj(k̃_i) e^{i(m-n)theta_i}] depends on m - n only. A new `place`, nothing else:
    keys are rotated before they are cached, values are never rotated. cfg.rope_layout picks the pairs.
    """

    def __init__(self, cfg: TransformerConfig):
        super().__init__(cfg)
        self.rope_dims = cfg.rope_dims or self.d_head  # the first rope_dims channels turn, the rest pass unchanged
        freq = rope_inv_freq(self.rope_dims, cfg.rope_base, cfg.rope_scaling, cfg.rope_factor, cfg.rope_train_len)
        self.register_buffer("inv_freq", freq, persistent=False)  # (rope_dims/2,) float64
        self.rope_gain = rope_attention_factor(cfg.rope_scaling, cfg.rope_factor)  # YaRN's temperature, on q and k

    def rotate(self, x: Tensor, pos: Tensor) -> Tensor:
        """x (B, h, T, d) at positions pos (B|1, T) -> rotated x."""
        cos, sin = rope_cos_sin(pos, self.inv_freq, x.dtype)  # (B|1, 1, T, rope_dims/2)
        r = self.rope_dims
        y = apply_rope(x[..., :r], cos, sin, self.cfg.rope_layout)
        y = y if self.rope_gain == 1.0 else y * self.rope_gain
        return y if r == x.shape[-1] else torch.cat([y, x[..., r:]], dim=-1)  # partial rotary: the rest unrotated

    def place(self, q: Tensor, kv: tuple[Tensor, ...], q_pos: Tensor, k_pos: Tensor) -> tuple[Tensor, tuple]:
        k, v = kv
        return self.rotate(q, q_pos), (self.rotate(k, k_pos), v)
# --8<-- [end:rope]


# --8<-- [start:alibi_attn]
class ALiBiAttention(MultiHeadAttention):
    """ALiBi: no position embedding; head h adds -m_h·|i - j| to its logits (m_h from alibi_slopes). A new `bias`:
    the fused (SDPA) and tiled paths take it like a mask, so ALiBi keeps the fast path."""

    def __init__(self, cfg: TransformerConfig):
        super().__init__(cfg)
        self.register_buffer("slopes", alibi_slopes(self.n_heads), persistent=False)  # (nh,)

    def bias(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        dist = (q_pos[:, :, None] - k_pos[:, None, :]).abs()  # (B|1, Tq, Tk)
        return -self.slopes[None, :, None, None] * dist[:, None].to(self.slopes.dtype)  # (B|1, nh, Tq, Tk)
# --8<-- [end:alibi_attn]


# --8<-- [start:t5_attn]
class T5BiasAttention(MultiHeadAttention):
    """T5's relative bias: a learned scalar per head and offset bucket (t5_bucket), added to the logits.
    Raffel et al. (2020, §2.1) share one table across layers; here each layer has its own (as in Shaw et al.)."""

    def __init__(self, cfg: TransformerConfig):
        super().__init__(cfg)
        self.rel_bias = nn.Parameter(torch.zeros(cfg.t5_buckets, self.n_heads))  # (buckets, nh): starts as no bias
        self.keep_init = [self.rel_bias]  # not a weight matrix: the model's Xavier init leaves it alone

    def bias(self, q_pos: Tensor, k_pos: Tensor) -> Tensor:
        offset = k_pos[:, None, :] - q_pos[:, :, None]  # (B|1, Tq, Tk): key minus query
        b = t5_bucket(offset, not self.causal, self.cfg.t5_buckets, self.cfg.t5_max_distance)
        return self.rel_bias[b].permute(0, 3, 1, 2)  # (B|1, Tq, Tk, nh) -> (B|1, nh, Tq, Tk)
# --8<-- [end:t5_attn]


def make_self_attention(cfg: TransformerConfig) -> MultiHeadAttention:
    """Self-attention for cfg.kv_latent, cfg.score_fn and cfg.positions: each variant overrides pieces of MultiHeadAttention."""
    if cfg.kv_latent:
        from .latent import AbsorbedLatentAttention, LatentAttention

        return (AbsorbedLatentAttention if cfg.mla_absorb else LatentAttention)(cfg)
    if cfg.score_fn == "additive":
        return AdditiveAttention(cfg)
    return {"shaw": ShawAttention, "xl": XLAttention, "rope": RotaryAttention, "alibi": ALiBiAttention,
            "t5": T5BiasAttention}.get(cfg.positions, MultiHeadAttention)(cfg)
