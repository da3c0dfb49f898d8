"""NF4, the 4-bit NormalFloat data type of QLoRA (Dettmers et al. 2023, §3), and blockwise 4-bit quantisation.

NF4's 16 levels are quantiles of N(0, 1), rescaled to [-1, 1], built asymmetrically so that 0 is a level:
8 from the positive half (probabilities evenly spaced from 1/2 to 1 - δ) and 7 from the negative half, plus 0.
Pre-trained weights are roughly normal, so levels spaced by the normal's quantiles put more of them where the
weights are dense. A block of `block` weights (64 in QLoRA) shares one absmax scale: w ≈ absmax · level.

Double quantisation stores those per-block scales themselves in 8 bits, with one 32-bit scale per 256 of them:
scale overhead 32/64 = 0.5 bits per weight becomes 8/64 + 32/(64·256) ≈ 0.127.
"""

from __future__ import annotations

from statistics import NormalDist

import torch
from torch import Tensor

DELTA = 0.5 * (1 / 32 + 1 / 30)  # the outermost probability is 1 - δ (a finite quantile); bitsandbytes' choice


def nf4_levels() -> Tensor:
    """The 16 NF4 levels, sorted, in [-1, 1], with 0 exactly representable."""
    q = NormalDist().inv_cdf
    top = q(1 - DELTA)
    pos = [q(0.5 + i * (0.5 - DELTA) / 8) / top for i in range(1, 9)]  # 8 positive levels, the last is 1
    neg = [-q(0.5 + i * (0.5 - DELTA) / 7) / top for i in range(1, 8)]  # 7 negative levels, the last is -1
    return torch.tensor(sorted(neg + [0.0] + pos), dtype=torch.float64)


def int4_levels() -> Tensor:
    """Symmetric absmax int4 as a code book: the 15 levels k/7, k = -7..7, for comparison with NF4."""
    return torch.arange(-7, 8, dtype=torch.float64) / 7


def blockwise_quantise(w: Tensor, levels: Tensor, block: int = 64) -> tuple[Tensor, Tensor]:
    """w (any shape, numel divisible by block) -> (indices (n_blocks, block) into levels, absmax (n_blocks,))."""
    if w.numel() % block:
        raise ValueError(f"{w.numel()} weights do not split into blocks of {block}: pad or pick a divisor.")
    x = w.detach().to(torch.float64).reshape(-1, block)            # (n_blocks, block)
    absmax = x.abs().amax(dim=1).clamp_min(1e-12)                   # (n_blocks,)
    idx = (x / absmax[:, None]).unsqueeze(-1).sub(levels).abs().argmin(-1)  # nearest level, (n_blocks, block)
    return idx, absmax


def blockwise_dequantise(idx: Tensor, absmax: Tensor, levels: Tensor, shape: torch.Size) -> Tensor:
    return (levels[idx] * absmax[:, None]).reshape(shape)


def bits_per_weight(code_bits: int = 4, block: int = 64, scale_bits: int = 32, double: bool = False,
                    block2: int = 256, scale2_bits: int = 32) -> float:
    """Storage per weight: the code, plus the block's scale; with double quantisation the scale is stored in
    8 bits and each block2 of those scales share one scale2_bits constant."""
    if not double:
        return code_bits + scale_bits / block
    return code_bits + 8 / block + scale2_bits / (block * block2)
