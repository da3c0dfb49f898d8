"""Post-training quantisation: absmax int8/int4 weights, int8 activation x weight matmuls, LLM.int8's decomposition.

Symmetric absmax quantisation of a block of numbers x with b bits:

    scale = max|x| / (2^(b-1) - 1)          127 for int8, 7 for int4 (the level -2^(b-1) is left unused)
    q     = round(x / scale)                an integer in [-(2^(b-1)-1), 2^(b-1)-1]
    x̂     = q · scale                       |x - x̂| ≤ scale / 2 for every element (round to nearest)

Granularity says which elements share one scale. For a weight W (out_features, in_features) of nn.Linear:

    per_tensor      one scale for the whole matrix
    per_channel     one scale per row (per output channel), over its in_features
    per_group(g)    one scale per g consecutive entries of a row (g must divide in_features)

For a matmul y = x Wᵀ with int8 activations too (W8A8), the scales must stay outside the inner sum so that the
integer product can be rescaled afterwards: one scale for all of x (per tensor) or one per token (row of x), times
one per output channel of W: y ≈ (s_x s_wᵀ) ⊙ (q_x q_wᵀ). LLM.int8 (Dettmers et al. 2022) calls the second
"vector-wise" and adds a mixed-precision decomposition: the feature columns of x holding any |x| ≥ threshold are
multiplied in full precision, the rest in int8.

Everything here is an emulation in floating point: the integers are exact (held in float64 for the product,
|q_x q_w| summed over in_features stays far below 2^53), no int8 kernel is called. It measures the rounding, not
the speed.

At the end: NF4, QLoRA's 4-bit NormalFloat code book, blockwise (64) NF4 quantisation, and the bits per
parameter of blockwise storage with and without double quantisation.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from statistics import NormalDist
from typing import Optional

import torch
import torch.nn as nn
from torch import Tensor

GRANULARITIES = ("per_tensor", "per_channel", "per_group")
ACT_MODES = ("per_tensor", "per_token")


def qmax(bits: int) -> int:
    """Largest integer level of symmetric b-bit quantisation: 2^(b-1) - 1 (127 for 8 bits, 7 for 4)."""
    if bits not in (4, 8):
        raise ValueError(f"bits={bits!r}: only 8 (int8) and 4 (int4) are supported")
    return 2 ** (bits - 1) - 1


@dataclass(frozen=True)
class Quantised:
    """Integer codes and the scales that turn them back into numbers: x̂ = codes · scale (scale broadcast per block).

    codes: torch.int8 (int4 values are stored in int8, within [-7, 7]); for per_group the codes are kept in the
    grouped shape (rows, n_groups, g) with scale (rows, n_groups, 1); `shape` is the original shape."""
    codes: Tensor
    scale: Tensor
    bits: int
    granularity: str
    group_size: Optional[int]
    shape: torch.Size


def _check_granularity(w: Tensor, granularity: str, group_size: Optional[int]) -> None:
    if granularity not in GRANULARITIES:
        raise ValueError(f"granularity={granularity!r}: use one of {GRANULARITIES}")
    if granularity != "per_tensor" and w.dim() != 2:
        raise ValueError(f"{granularity} needs a 2-D weight (out_features, in_features), got shape {tuple(w.shape)}")
    if granularity == "per_group":
        if group_size is None or group_size < 1:
            raise ValueError(f"per_group needs a positive group_size, got {group_size!r}")
        if w.shape[1] % group_size:
            raise ValueError(f"group_size={group_size} does not divide in_features={w.shape[1]}: pick a divisor")
    elif group_size is not None:
        raise ValueError(f"group_size={group_size} is only meaningful with granularity='per_group'")


# --8<-- [start:quantise]
def absmax_scale(x: Tensor, bits: int, dim=None) -> Tensor:
    """max|x| / qmax over `dim` (all elements if None), kept broadcastable; an all-zero block gets scale 1."""
    a = x.abs().amax() if dim is None else x.abs().amax(dim=dim, keepdim=True)
    return torch.where(a > 0, a / qmax(bits), torch.ones_like(a))


def quantise(w: Tensor, bits: int = 8, granularity: str = "per_channel", group_size: Optional[int] = None) -> Quantised:
    """Symmetric absmax quantisation of w at the given granularity (see the module docstring)."""
    _check_granularity(w, granularity, group_size)
    x = w.detach()
    if granularity == "per_tensor":
        scale = absmax_scale(x, bits)                                   # () one number
    elif granularity == "per_channel":
        scale = absmax_scale(x, bits, dim=1)                            # (out, 1) one per row
    else:
        x = x.reshape(x.shape[0], x.shape[1] // group_size, group_size)  # (out, in/g, g)
        scale = absmax_scale(x, bits, dim=2)                            # (out, in/g, 1) one per group
    codes = torch.round(x / scale).clamp(-qmax(bits), qmax(bits)).to(torch.int8)
    return Quantised(codes, scale, bits, granularity, group_size, w.shape)


def dequantise(q: Quantised) -> Tensor:
    """codes · scale, back in the original shape."""
    return (q.codes.to(q.scale.dtype) * q.scale).reshape(q.shape)


def fake_quantise(w: Tensor, bits: int = 8, granularity: str = "per_channel", group_size: Optional[int] = None) -> Tensor:
    """dequantise(quantise(w)): the numbers a quantised model computes with."""
    return dequantise(quantise(w, bits, granularity, group_size)).to(w.dtype)
# --8<-- [end:quantise]


def elementwise_scale(q: Quantised) -> Tensor:
    """The scale each element of the original tensor was quantised with, in the original shape."""
    return q.scale.expand(q.codes.shape).reshape(q.shape)


# --8<-- [start:matmul]
def int8_matmul(x: Tensor, w: Tensor, act: str = "per_token", threshold: Optional[float] = None) -> Tensor:
    """Emulated W8A8 product y = x wᵀ: x (..., in) and w (out, in) → (..., out).

    x is quantised to int8 with one scale for the whole tensor (act="per_tensor") or one per token (row,
    act="per_token"); w with one scale per output channel. The integer product is exact (float64) and is
    rescaled by s_x · s_w. With a threshold (LLM.int8's mixed-precision decomposition), every feature column of
    x whose largest |x| reaches it is taken out of the int8 product and multiplied in full precision."""
    if act not in ACT_MODES:
        raise ValueError(f"act={act!r}: use one of {ACT_MODES}")
    if w.dim() != 2 or x.shape[-1] != w.shape[1]:
        raise ValueError(f"x (..., {x.shape[-1]}) and w {tuple(w.shape)} do not match: w must be (out, in)")
    x2 = x.reshape(-1, x.shape[-1]).double()                     # (N, in): every token a row
    w2 = w.detach().double()                                      # (out, in)
    outlier = torch.zeros(x2.shape[1], dtype=torch.bool)
    if threshold is not None:
        outlier = x2.abs().amax(dim=0) >= threshold               # (in,) columns kept in full precision
    xr, wr = x2[:, ~outlier], w2[:, ~outlier]                     # the regular part, to int8
    y = x2[:, outlier] @ w2[:, outlier].T                         # (N, out): the outlier columns, full precision
    if xr.shape[1]:                                               # (every column an outlier: nothing left for int8)
        sx = absmax_scale(xr, 8) if act == "per_tensor" else absmax_scale(xr, 8, dim=1)  # () or (N, 1)
        sw = absmax_scale(wr, 8, dim=1)                           # (out, 1)
        # sw is taken over the regular columns only, and the outlier columns of w stay in full precision. A kernel
        # that quantises the whole row of w once, outlier columns included, could get a coarser sw: we did not
        # check which bitsandbytes does, so this is our choice, not a copy of its kernel.
        qx = torch.round(xr / sx).clamp(-127, 127)
        qw = torch.round(wr / sw).clamp(-127, 127)
        y = y + (qx @ qw.T) * sx * sw.T                           # int32-style sum of integers, then rescale
    return y.to(x.dtype).reshape(*x.shape[:-1], w.shape[0])
# --8<-- [end:matmul]


# --8<-- [start:smooth]
def smoothing_factors(act_absmax: Tensor, weight_absmax: Tensor, alpha: float = 0.5) -> Tensor:
    """SmoothQuant's per-input-channel factors s_j = max|X_j|^alpha / max|W_j|^(1-alpha): (in,) from two (in,).

    act_absmax: max |x| of each input feature over calibration tokens; weight_absmax: max |W[:, j]| over every
    linear map that reads those features. Dividing feature j by s_j (folded into the producer, e.g. a norm's gain
    and bias) and multiplying column j of each reader by s_j leaves x Wᵀ unchanged in real arithmetic; afterwards
    max|X_j / s_j| = max|W_j s_j| = max|X_j|^(1-alpha) · max|W_j|^alpha. A feature or column that is all zero gets 1."""
    if act_absmax.shape != weight_absmax.shape or act_absmax.dim() != 1:
        raise ValueError(f"act_absmax {tuple(act_absmax.shape)} and weight_absmax {tuple(weight_absmax.shape)} "
                         "must be the same 1-D shape (in_features,)")
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha={alpha!r}: the migration strength must lie in [0, 1]")
    if (act_absmax < 0).any() or (weight_absmax < 0).any():
        raise ValueError("act_absmax and weight_absmax are maxima of |.|: they cannot be negative")
    ok = (act_absmax > 0) & (weight_absmax > 0)
    s = act_absmax.pow(alpha) / weight_absmax.pow(1.0 - alpha)   # pow(., 0.5) is a correctly rounded sqrt
    return torch.where(ok, s, torch.ones_like(s))
# --8<-- [end:smooth]


class Int8Linear(nn.Module):
    """An nn.Linear whose matmul runs through int8_matmul (activations and weights in int8, bias in float)."""

    def __init__(self, linear: nn.Linear, act: str = "per_token", threshold: Optional[float] = None):
        super().__init__()
        if act not in ACT_MODES:
            raise ValueError(f"act={act!r}: use one of {ACT_MODES}")
        self.weight = nn.Parameter(linear.weight.detach().clone(), requires_grad=False)  # (out, in)
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach().clone(), requires_grad=False)
        self.act, self.threshold = act, threshold

    def forward(self, x: Tensor) -> Tensor:
        y = int8_matmul(x, self.weight, self.act, self.threshold)
        return y if self.bias is None else y + self.bias


# --8<-- [start:model]
def quantise_model(model: nn.Module, bits: int = 8, granularity: str = "per_channel",
                   group_size: Optional[int] = None, activations: Optional[str] = None,
                   threshold: Optional[float] = None) -> nn.Module:
    """A quantised copy of `model` (the original is untouched); embeddings and norms stay in float.

    activations=None: weight-only, every nn.Linear's weight replaced by fake_quantise(weight, bits, granularity).
    activations="per_tensor" | "per_token": W8A8, every nn.Linear replaced by an Int8Linear (weights int8 per
    output channel, so bits must be 8 and granularity per_channel), with LLM.int8's decomposition at `threshold`."""
    qmax(bits)
    if activations is None and threshold is not None:
        raise ValueError("threshold applies to activations: pass activations='per_tensor' or 'per_token'")
    if activations is not None and (bits != 8 or granularity != "per_channel" or group_size is not None):
        raise ValueError("activation quantisation here is int8 with per-channel weights (LLM.int8's vector-wise): "
                         "use bits=8, granularity='per_channel', no group_size")
    q = copy.deepcopy(model).eval()
    linears = [(parent, name, child) for parent in q.modules() for name, child in parent.named_children()
               if isinstance(child, nn.Linear)]
    if not linears:
        raise ValueError("the model has no nn.Linear layer to quantise")
    for parent, name, child in linears:
        if activations is None:
            with torch.no_grad():
                child.weight.copy_(fake_quantise(child.weight, bits, granularity, group_size))
        else:
            setattr(parent, name, Int8Linear(child, activations, threshold))
    return q
# --8<-- [end:model]


# --8<-- [start:nf4]
# NF4, QLoRA's 4-bit NormalFloat (Dettmers et al. 2023, §3). Its 16 levels are quantiles of N(0, 1) rescaled to
# [-1, 1], built asymmetrically so that 0 is a level: 8 from the positive half (probabilities evenly spaced from
# 1/2 to 1 - δ) and 7 from the negative half, plus 0. A block of 64 weights shares one absmax constant, as in
# per_group int4 above: w ≈ absmax · level. Double quantisation stores those fp32 constants in 8 bits, with one
# fp32 constant per 256 of them.
# The paper's equation averages adjacent quantiles at i / (2^k + 1); we follow bitsandbytes' create_normal_map
# instead (its offset 0.9677 = 1 - δ), a code choice not in the paper, checked against bitsandbytes' table.
NF4_DELTA = 0.5 * (1 / 32 + 1 / 30)  # the outermost probability is 1 - δ (a finite quantile); bitsandbytes' choice


def nf4_levels() -> Tensor:
    """The 16 NF4 levels, sorted, in [-1, 1], with 0 exactly representable (float64)."""
    q = NormalDist().inv_cdf
    top = q(1 - NF4_DELTA)
    pos = [q(0.5 + i * (0.5 - NF4_DELTA) / 8) / top for i in range(1, 9)]  # 8 positive levels, the last is 1
    neg = [-q(0.5 + i * (0.5 - NF4_DELTA) / 7) / top for i in range(1, 8)]  # 7 negative levels, the last is -1
    return torch.tensor(sorted(neg + [0.0] + pos), dtype=torch.float64)


def nf4_quantise(w: Tensor, block: int = 64) -> tuple[Tensor, Tensor]:
    """w (any shape, numel divisible by block) -> (codes (n_blocks, block) int64 indices into nf4_levels(),
    absmax (n_blocks,) float64): each weight goes to the nearest level of w / absmax of its block."""
    if block < 1 or w.numel() % block:
        raise ValueError(f"{w.numel()} weights do not split into blocks of {block}: pad, or pick a positive divisor")
    x = w.detach().to(torch.float64).reshape(-1, block)                   # (n_blocks, block)
    absmax = x.abs().amax(dim=1)                                          # (n_blocks,)
    absmax = torch.where(absmax > 0, absmax, torch.ones_like(absmax))     # an all-zero block: constant 1
    codes = (x / absmax[:, None]).unsqueeze(-1).sub(nf4_levels()).abs().argmin(-1)  # (n_blocks, block)
    return codes, absmax


def nf4_dequantise(codes: Tensor, absmax: Tensor, shape: torch.Size) -> Tensor:
    """levels[codes] · absmax, back in `shape` (float64)."""
    return (nf4_levels()[codes] * absmax[:, None]).reshape(shape)


def bits_per_parameter(code_bits: int = 4, block: int = 64, const_bits: int = 32, double: bool = False,
                       dq_bits: int = 8, block2: int = 256) -> float:
    """Storage per weight: the code plus its share of the block's constant (const_bits / block). With double
    quantisation the block constants are stored in dq_bits, and each block2 of them share one const_bits
    constant: code_bits + dq_bits / block + const_bits / (block · block2)."""
    if not double:
        return code_bits + const_bits / block
    return code_bits + dq_bits / block + const_bits / (block * block2)
# --8<-- [end:nf4]
