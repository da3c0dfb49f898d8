"""Normalisation layers: LayerNorm, RMSNorm, a token-wise BatchNorm, and the factory the other files use.

    LayerNorm(x) = (x - mean(x)) / sqrt(var(x) + eps) · g + b      per token, over its C features
    RMSNorm(x)   = x / sqrt(mean(x²) + eps) · g                     no centring, no bias (Zhang & Sennrich 2019)
    BatchNorm    per channel, over all B·T tokens of the batch (padding included)
"""

from __future__ import annotations

import torch
import torch.nn as nn
from torch import Tensor


# --8<-- [start:rmsnorm]
class RMSNorm(nn.Module):
    """x / RMS(x) · g over the last dimension: LayerNorm without the mean subtraction and without a bias."""

    def __init__(self, width: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(width))  # g, the per-channel gain

    def forward(self, x: Tensor) -> Tensor:
        rms = torch.sqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)  # (..., 1)
        return x / rms * self.weight
# --8<-- [end:rmsnorm]


class TokenBatchNorm(nn.BatchNorm1d):
    """BatchNorm over every token of the batch (B*T samples, C channels); padding tokens count too."""

    def forward(self, x: Tensor) -> Tensor:
        B, T, C = x.shape
        return super().forward(x.reshape(B * T, C)).view(B, T, C)  # (B·T, C) -> (B, T, C)


def make_norm(kind: str, width: int, eps: float = 1e-5) -> nn.Module:
    """'layer', 'rms', 'batch' or 'none' over `width` features."""
    if kind == "layer":
        return nn.LayerNorm(width, eps=eps)  # each token over its features
    if kind == "rms":
        return RMSNorm(width, eps=eps)
    if kind == "batch":
        return TokenBatchNorm(width, eps=eps)
    return nn.Identity()
