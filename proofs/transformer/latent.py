"""Multi-head latent attention (MLA, DeepSeek-V2 2024, §2.1.2–2.1.3): cache one small latent per token, not keys and values.

    c_j   = W_DKV x_j                     (d_c = cfg.kv_latent): what the cache keeps, shared by every head (eq. 9)
    k_j,h = W_UK,h c_j    v_j,h = W_UV,h c_j         per-head keys and values, up-projected from the latent (eqs. 10-11)
    with RoPE: q_h = [W_Q,h x_i ; RoPE(W_QR,h x_i)],  k_j,h = [W_UK,h c_j ; RoPE(W_KR x_j)]            (eqs. 14-17)
               a decoupled rotary key of d_r = mla_rope_dim channels, one for all heads, cached beside c_j,
               and logits scaled by 1/sqrt(d_head + d_r) (eq. 18); values carry no rotary part
    cache per token and layer: d_c (+ d_r) numbers, against 2·n_heads·d_head for MHA (Table 1)

Materialised (LatentAttention): up-project the cached latents to keys and values, then attend as usual.
Absorbed (AbsorbedLatentAttention, cfg.mla_absorb): q_h·(W_UK,h c_j) = (W_UK,hᵀ q_h)·c_j, so W_UK,h can be
folded into the query map (W_UK,hᵀ W_Q,h) and the queries attend over the latents directly; on the output
side Σ_j a_ij W_UV,h c_j = W_UV,h Σ_j a_ij c_j, so W_UV,h can be folded into W_O. Same outputs, no per-token
up-projection; here the folds are applied as matrix products at run time (W_UK,hᵀ after W_Q, W_UV,h before W_O).
RoPE on the up-projected keys would put a rotation R_{j-i} between W_Q,h and W_UK,h that depends on the pair
of positions, so no single folded matrix exists: that is why the rotary part is a separate key (§2.1.3).
DeepSeek-V2 also compresses the queries through a latent c_Q (eqs. 12-13), which saves activation memory in
training, not cache; it is left out: the queries (and rotary queries) come from x directly.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn as nn
from torch import Tensor

from .attention import MultiHeadAttention, Pos
from .config import TransformerConfig
from .positions import apply_rope, rope_attention_factor, rope_cos_sin, rope_inv_freq


# --8<-- [start:mla]
class LatentAttention(MultiHeadAttention):
    """MLA, materialised: new project_q / project_kv / place / keys_values; score and mix inherited."""

    def __init__(self, cfg: TransformerConfig):
        super().__init__(cfg)
        C, nh, hs, d_c, d_r = cfg.d_model, self.n_heads, self.d_head, cfg.kv_latent, cfg.mla_rope_dim
        del self.w_k, self.w_v  # keys and values come from the latent instead
        self.w_k = self.w_v = None
        self.w_dkv = nn.Linear(C, d_c, bias=False)  # down-projection: the cached latent c
        self.w_uk = nn.Linear(d_c, nh * hs, bias=False)  # up-projection to every head's key
        self.w_uv = nn.Linear(d_c, nh * hs, bias=False)  # up-projection to every head's value
        self.d_rope = d_r
        if d_r:
            self.w_qr = nn.Linear(C, nh * d_r, bias=False)  # per-head rotary queries
            self.w_kr = nn.Linear(C, d_r, bias=False)  # one rotary key for all heads, cached beside c
            freq = rope_inv_freq(d_r, cfg.rope_base, cfg.rope_scaling, cfg.rope_factor, cfg.rope_train_len)
            self.register_buffer("inv_freq", freq, persistent=False)
            self.rope_gain = rope_attention_factor(cfg.rope_scaling, cfg.rope_factor)
        if cfg.attn_scale == "sqrt_dk":
            self.scale = (hs + d_r) ** -0.5  # the query·key dot product runs over hs + d_r channels

    def project_q(self, x: Tensor) -> Tensor:
        q = self._heads(self.w_q(x))  # (B, nh, Tq, hs)
        if not self.d_rope:
            return q
        B, T, _ = x.shape
        q_r = self.w_qr(x).view(B, T, self.n_heads, self.d_rope).transpose(1, 2)  # (B, nh, Tq, d_r)
        return torch.cat([q, q_r], dim=-1)  # (B, nh, Tq, hs + d_r)

    def project_kv(self, kv: Tensor) -> tuple[Tensor, ...]:
        """What the cache keeps: the latent (B, 1, Tk, d_c) and, with RoPE, the rotary key (B, 1, Tk, d_r)."""
        c = self.w_dkv(kv)[:, None]  # (B, 1, Tk, d_c): one "head" of width d_c
        return (c, self.w_kr(kv)[:, None]) if self.d_rope else (c,)

    def place(self, q: Tensor, kv: tuple[Tensor, ...], q_pos: Tensor, k_pos: Tensor) -> tuple[Tensor, tuple]:
        if not self.d_rope:
            return q, kv
        c, k_r = kv
        hs = self.d_head
        return torch.cat([q[..., :hs], self._rotate(q[..., hs:], q_pos)], -1), (c, self._rotate(k_r, k_pos))

    def _rotate(self, x: Tensor, pos: Tensor) -> Tensor:
        cos, sin = rope_cos_sin(pos, self.inv_freq, x.dtype)  # (B|1, 1, T, d_r/2)
        return apply_rope(x, cos, sin, self.cfg.rope_layout) * self.rope_gain

    def keys_values(self, kv: tuple[Tensor, ...]) -> tuple[Tensor, Tensor]:
        """Latents -> per-head keys (B, nh, Tk, hs [+ d_r]) and values (B, nh, Tk, hs): the materialised form."""
        c = kv[0][:, 0]  # (B, Tk, d_c)
        k = self._heads(self.w_uk(c))  # (B, nh, Tk, hs)
        v = self._heads(self.w_uv(c))  # (B, nh, Tk, hs)
        if self.d_rope:
            k_r = kv[1].expand(-1, self.n_heads, -1, -1)  # (B, nh, Tk, d_r): the one rotary key, for every head
            k = torch.cat([k, k_r], dim=-1)
        return k, v


class AbsorbedLatentAttention(LatentAttention):
    """MLA, absorbed: the queries move into latent space (W_UKᵀ q) and the weights meet the latents before W_UV."""

    def keys_values(self, kv: tuple[Tensor, ...]) -> tuple[Tensor, Tensor]:
        """As cached: "keys" = [latent ; rotary key] (B, 1, Tk, d_c [+ d_r]), "values" = the latent (B, 1, Tk, d_c)."""
        return torch.cat(kv, dim=-1), kv[0]

    def score(self, q: Tensor, k: Tensor, pos: Optional[Pos] = None) -> Tensor:
        hs, d_c = self.d_head, self.cfg.kv_latent
        w_uk = self.w_uk.weight.view(self.n_heads, hs, d_c)  # (nh, hs, d_c): W_UK,h
        q_lat = torch.einsum("bhtd,hdc->bhtc", q[..., :hs], w_uk)  # (B, nh, Tq, d_c): W_UK,hᵀ q_h
        s = q_lat @ k[..., :d_c].transpose(-2, -1)  # (B, nh, Tq, Tk): q_h·(W_UK,h c_j), no key formed
        if self.d_rope:
            s = s + q[..., hs:] @ k[..., d_c:].transpose(-2, -1)  # the decoupled rotary term
        return s * self.scale

    def mix(self, attn: Tensor, v: Tensor, pos: Optional[Pos] = None) -> Tensor:
        w_uv = self.w_uv.weight.view(self.n_heads, self.d_head, -1)  # (nh, hs, d_c): W_UV,h
        pooled = attn @ v  # (B, nh, Tq, d_c): Σ_j a_ij c_j
        return torch.einsum("bhtc,hdc->bhtd", pooled, w_uv)  # (B, nh, Tq, hs): W_UV,h Σ_j a_ij c_j
# --8<-- [end:mla]
