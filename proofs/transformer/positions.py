"""Positions as functions: sinusoids, rotary angles (and their long-context scalings), ALiBi slopes, T5 buckets.

Nothing here has parameters; the modules that use these live in `embeddings` (absolute tables) and
`variants` (rotary, ALiBi, T5, Shaw, XL inside attention). Each function is short enough to check
against the paper's formula, which its docstring states.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


def sinusoidal_table(length: int, d_model: int, base: float = 10000.0) -> Tensor:
    """(length, d_model): PE[pos, 2i] = sin(pos / base^(2i/d)), PE[pos, 2i+1] = cos(same)."""
    pos = torch.arange(length, dtype=torch.float64)[:, None]  # (T, 1)
    inv_freq = base ** (-torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)  # (C/2,)
    angle = pos * inv_freq  # (T, C/2)
    pe = torch.zeros(length, d_model, dtype=torch.float64)
    pe[:, 0::2] = torch.sin(angle)
    pe[:, 1::2] = torch.cos(angle[:, : d_model // 2])
    return pe.float()


# --8<-- [start:rope_freq]
def rope_inv_freq(d: int, base: float = 10000.0, scaling: str = "none", factor: float = 1.0,
                  train_len: int = 64, yarn_alpha: float = 1.0, yarn_beta: float = 32.0) -> Tensor:
    """(d/2,) float64 angular frequencies theta_i of the d/2 rotated pairs; position m turns pair i by m·theta_i.

    none:   theta_i = base^(-2i/d)                                (Su et al. 2021, eq. 15)
    linear: theta_i / factor: position m acts as m/factor         (position interpolation, Chen et al. 2023)
    ntk:    base · factor^(d/(d-2)): the lowest frequency is interpolated by `factor`, the highest kept ("NTK-aware")
    yarn:   per pair, interpolate only the slow pairs: with r_i = train_len / wavelength_i,
            gamma_i = clamp((r_i - alpha) / (beta - alpha), 0, 1),  theta_i' = (1 - gamma_i)·theta_i/factor + gamma_i·theta_i
            (Peng et al. 2023, "NTK-by-parts"; the attention temperature is `rope_attention_factor`)
    """
    theta = base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)  # (d/2,)
    if scaling == "none" or factor == 1.0:
        return theta
    if scaling == "linear":
        return theta / factor
    if scaling == "ntk":
        return (base * factor ** (d / (d - 2))) ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    if scaling == "yarn":
        r = train_len * theta / (2 * math.pi)  # full turns each pair makes over the training length
        gamma = ((r - yarn_alpha) / (yarn_beta - yarn_alpha)).clamp(0.0, 1.0)
        return (1 - gamma) * theta / factor + gamma * theta
    raise ValueError(f"unknown rope scaling {scaling!r}")


def rope_attention_factor(scaling: str, factor: float) -> float:
    """YaRN's temperature: q and k are both multiplied by 0.1·ln(factor) + 1 (so logits by its square); 1 otherwise."""
    return 0.1 * math.log(factor) + 1.0 if scaling == "yarn" and factor > 1 else 1.0
# --8<-- [end:rope_freq]


# --8<-- [start:rope_apply]
def rope_cos_sin(pos: Tensor, inv_freq: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """pos (B, T) integer positions -> cos, sin of shape (B, 1, T, d/2): the angle of every pair at every position."""
    angle = pos.to(torch.float64)[:, None, :, None] * inv_freq.to(pos.device)  # (B, 1, T, d/2)
    return angle.cos().to(dtype), angle.sin().to(dtype)


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor, layout: str = "interleaved") -> Tensor:
    """Rotate each pair of channels of x (B, h, T, d) by its angle: (a, b) -> (a cos - b sin, a sin + b cos).

    interleaved: pair i is channels (2i, 2i+1) (Su et al.; GPT-J; Meta's original LLaMA code on complex numbers).
    half:        pair i is channels (i, i + d/2), "rotate_half" (GPT-NeoX; Hugging Face's LLaMA).
    """
    if layout == "interleaved":
        a, b = x[..., 0::2], x[..., 1::2]  # (B, h, T, d/2) each
        return torch.stack([a * cos - b * sin, a * sin + b * cos], dim=-1).flatten(-2)  # pairs back side by side
    a, b = x.chunk(2, dim=-1)  # (B, h, T, d/2) each
    return torch.cat([a * cos - b * sin, a * sin + b * cos], dim=-1)


def rope_permutation(d: int) -> Tensor:
    """(d,) index: rows of an interleaved-layout W_Q/W_K taken in this order give the rotate-half layout.

    Half-layout channel i is interleaved channel 2i, half-layout channel i + d/2 is interleaved 2i + 1.
    """
    return torch.cat([torch.arange(0, d, 2), torch.arange(1, d, 2)])
# --8<-- [end:rope_apply]


# --8<-- [start:alibi]
def alibi_slopes(n_heads: int) -> Tensor:
    """(n_heads,) ALiBi slopes (Press et al. 2022, §3): the geometric sequence 2^(-8/n), 2^(-16/n), ... for n a
    power of two; otherwise the slopes of the nearest smaller power of two p, then every other slope of 2p."""
    def geometric(n: int) -> list[float]:
        start = 2.0 ** (-8.0 / n)
        return [start ** (i + 1) for i in range(n)]

    p = 2 ** int(math.floor(math.log2(n_heads)))
    slopes = geometric(p) + geometric(2 * p)[0::2][: n_heads - p]
    return torch.tensor(slopes, dtype=torch.float32)
# --8<-- [end:alibi]


# --8<-- [start:t5_bucket]
def t5_bucket(offset: Tensor, bidirectional: bool, n_buckets: int = 32, max_distance: int = 128) -> Tensor:
    """Bucket of each key-minus-query offset (Raffel et al. 2020, §2.1; as in the T5 code).

    Bidirectional: half the buckets for keys after the query, half for keys before. Within a half,
    the first half of the buckets hold the distances 0, 1, ... exactly, the rest cover distances up to
    max_distance on a log scale, and every distance beyond lands in the last bucket.
    Unidirectional (causal): only keys at or before the query, all buckets for them.
    """
    if bidirectional:
        n_buckets //= 2
        base = (offset > 0).long() * n_buckets  # keys after the query use the upper half
        dist = offset.abs()
    else:
        base = torch.zeros_like(offset)
        dist = (-offset).clamp(min=0)  # distance back to an earlier key
    exact = n_buckets // 2
    if exact < 1 or max_distance <= exact:
        raise ValueError(f"t5_bucket: need n_buckets >= {4 if bidirectional else 2} and max_distance > {exact} "
                         f"(the exact buckets), got {n_buckets * (2 if bidirectional else 1)} and {max_distance}.")
    far = exact + (torch.log(dist.float().clamp(min=1) / exact) / math.log(max_distance / exact)
                   * (n_buckets - exact)).long()
    far = far.clamp(max=n_buckets - 1)
    return base + torch.where(dist < exact, dist, far)
# --8<-- [end:t5_bucket]
