"""A selective state-space mixer (Mamba's S6, Gu & Dao 2023), its parallel scan, and the convolution form of the
time-invariant case: `MixerConfig(mixer="ssm")`.

Per channel d of the inner width and state index n, with A = -exp(A_log) < 0 fixed per (d, n):

    h_t = Ā_t ⊙ h_{t-1} + B̄_t u_t,     Ā_t = exp(Δ_t A),  B̄_t = Δ_t B_t,     y_t = C_t · h_t + D u_t

Selective (ssm_selective=True, §3.2, Algorithm 2): B_t = Linear_N(u_t), C_t = Linear_N(u_t), Δ_t =
softplus(Linear_D(Linear_R(u_t)) + bias), so the recurrence's coefficients change with every token. Time-invariant
(ssm_selective=False, S4-like): Δ, B, C are parameters, the same at every step.

Discretisation: Ā is zero-order hold, exp(ΔA), as the paper's eq. 4; B̄ = ΔB is the simplified (Euler) form that the
reference code uses (`selective_scan_ref` in state-spaces/mamba computes deltaB_u = Δ·B·u), not eq. 4's
(ΔA)^{-1}(exp(ΔA) - I)·ΔB. Both are first-order accurate in Δ; neither changes anything the proofs check.

The block around the scan is Mamba's (Fig. 3), inner width = d_model (Mamba expands by 2): u = SiLU(conv(w_v x)),
gate z = w_z x, output w_o(ssm(u) ⊙ SiLU(z)). w_v and w_o carry attention's names so init_weights scales them as it
scales attention's value and output maps (gpt2 / deepnorm depth init). Heads play no part here.

Three ways to compute the same recurrence:
    recurrent(): a token loop carrying h (and the conv's last inputs): decoding, through a RecurrentState.
    parallel():  associative_scan over the pairs (Ā_t, B̄_t u_t): ceil(log2 T) sequential rounds (Hillis-Steele).
    lti_kernel() + causal_conv(): only when Δ, B, C are fixed: y = K * u with K_k = C Ā^k B̄ (S4's convolution, eq. 3a).
"""

from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from .config import ConfigError
from .mixers import MixerConfig, RecurrentState, check_call


# --8<-- [start:scan]
def combine(earlier: tuple[Tensor, Tensor], later: tuple[Tensor, Tensor]) -> tuple[Tensor, Tensor]:
    """Two steps h -> a1 h + b1, then h -> a2 h + b2, as one: h -> (a2 a1) h + (a2 b1 + b2). Associative."""
    a1, b1 = earlier
    a2, b2 = later
    return a2 * a1, a2 * b1 + b2


def associative_scan(a: Tensor, b: Tensor, dim: int = 0, stats: Optional[dict] = None) -> Tensor:
    """All states of h_t = a_t ⊙ h_{t-1} + b_t with h_{-1} = 0, along `dim`, by an inclusive Hillis-Steele scan.

    Round r combines every position t with the one 2^r earlier, so after ceil(log2 T) rounds position t holds the
    composition of steps 0..t, whose b is h_t. Each round is one elementwise step over all positions (parallel);
    the rounds are the sequential depth, counted in stats["rounds"] (stats["combines"]: pairs combined).
    """
    a, b = a.movedim(dim, 0), b.movedim(dim, 0)
    T, offset, rounds, combines = a.shape[0], 1, 0, 0
    while offset < T:
        earlier = (torch.cat([torch.ones_like(a[:offset]), a[:-offset]]),  # the step 2^r before each position; an
                   torch.cat([torch.zeros_like(b[:offset]), b[:-offset]]))  # identity step (1, 0) before the start
        a, b = combine(earlier, (a, b))
        rounds, combines, offset = rounds + 1, combines + (T - offset), offset * 2
    if stats is not None:
        stats.update(rounds=rounds, combines=combines)
    return b.movedim(0, dim)
# --8<-- [end:scan]


# --8<-- [start:conv]
def lti_kernel(a_bar: Tensor, b_bar: Tensor, c: Tensor, T: int) -> Tensor:
    """(..., N) fixed Ā, B̄, C -> (..., T) kernel K_k = Σ_n C_n Ā_n^k B̄_n, k = 0..T-1 (diagonal A)."""
    k = torch.arange(T, dtype=a_bar.dtype, device=a_bar.device)
    return (c[..., None] * a_bar[..., None] ** k * b_bar[..., None]).sum(-2)  # (..., T)


def causal_conv(u: Tensor, K: Tensor) -> Tensor:
    """y_t = Σ_{k=0}^{t} K_k u_{t-k} per channel: u (B, T, D), K (D, T) -> (B, T, D)."""
    Bsz, T, D = u.shape
    w = K.flip(-1)[:, None, :]  # (D, 1, T): conv1d correlates, so flip the kernel
    return F.conv1d(F.pad(u.transpose(1, 2), (T - 1, 0)), w, groups=D).transpose(1, 2)
# --8<-- [end:conv]


# --8<-- [start:ssm]
class SelectiveSSM(nn.Module):
    """Mamba's selective SSM (S6) as a mixer of the shared DecoderLM, with a RecurrentState for decoding."""

    name = "ssm"

    def __init__(self, cfg: MixerConfig):
        super().__init__()
        if not isinstance(cfg, MixerConfig):
            raise ConfigError(f"SelectiveSSM takes a MixerConfig, got {type(cfg).__name__}: build it with mixer_lm().")
        self.cfg = cfg
        D, N, k = cfg.d_model, cfg.ssm_state, cfg.ssm_conv
        self.w_v = nn.Linear(D, D, bias=False)  # the branch the scan carries (half of Mamba's in_proj)
        self.w_z = nn.Linear(D, D, bias=False)  # the gate branch (the other half)
        self.conv = nn.Conv1d(D, D, k, groups=D, padding=k - 1) if k else None  # causal depthwise, Mamba's d_conv
        dt = torch.exp(torch.rand(D) * (math.log(0.1) - math.log(1e-3)) + math.log(1e-3))  # Δ in [0.001, 0.1] (Mamba)
        dt_bias = dt + torch.log(-torch.expm1(-dt))  # softplus^{-1}(dt)
        if cfg.ssm_selective:
            self.dt_rank = math.ceil(D / 16)  # Mamba's dt_rank="auto"
            self.x_proj = nn.Linear(D, self.dt_rank + 2 * N, bias=False)  # u_t -> (Δ low-rank, B_t, C_t)
            self.dt_proj = nn.Linear(self.dt_rank, D)  # low rank -> one Δ per channel
            with torch.no_grad():
                self.dt_proj.bias.copy_(dt_bias)
        else:
            self.dt = nn.Parameter(dt_bias)  # softplus^{-1}(Δ): one fixed step per channel
            self.B = nn.Parameter(torch.randn(D, N) / math.sqrt(N))  # fixed, per channel (S4D)
            self.C = nn.Parameter(torch.randn(D, N) / math.sqrt(N))
        self.A_log = nn.Parameter(torch.log(torch.arange(1, N + 1, dtype=torch.float32)).repeat(D, 1))  # S4D-real
        self.D = nn.Parameter(torch.ones(D))  # skip u_t -> y_t
        self.w_o = nn.Linear(D, D, bias=False)  # out_proj: the residual branch's last map, scaled like attention's W_O
        self.keep_init = [self.A_log] + ([] if cfg.ssm_selective else [self.B, self.C])  # init_weights leaves these

    def discretise(self, u: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """u (B, T, D) -> Ā (B|1, T|1, D, N), B̄ (B|1, T|1, D, N), C (B|1, T|1, 1|D, N): the step's coefficients."""
        A = -torch.exp(self.A_log.to(u.dtype))  # (D, N), negative: |Ā| < 1, the state decays
        if self.cfg.ssm_selective:
            N = self.cfg.ssm_state
            dt_low, B, C = self.x_proj(u).split([self.dt_rank, N, N], dim=-1)  # (B, T, R), (B, T, N), (B, T, N)
            delta = F.softplus(self.dt_proj(dt_low))  # (B, T, D): one step size per token and channel
            return torch.exp(delta[..., None] * A), delta[..., None] * B[:, :, None, :], C[:, :, None, :]
        delta = F.softplus(self.dt)[None, None, :]  # (1, 1, D): the same at every token
        return torch.exp(delta[..., None] * A), delta[..., None] * self.B, self.C[None, None]

    def inputs(self, x: Tensor, conv_state: Optional[Tensor] = None) -> tuple[Tensor, Tensor, Optional[Tensor]]:
        """x (B, T, C) -> u = SiLU(conv(w_v x)) (B, T, D), gate z (B, T, D), and the conv's last k-1 inputs."""
        v, z = self.w_v(x), self.w_z(x)
        if self.conv is None:
            return F.silu(v), z, None
        k = self.conv.kernel_size[0]
        if conv_state is None:
            conv_state = v.new_zeros(v.shape[0], k - 1, v.shape[2])
        full = torch.cat([conv_state, v], dim=1)  # (B, k-1+T, D): the causal window of every new token
        T, w = v.shape[1], self.conv.weight[:, 0]  # (D, k)
        u = sum(full[:, j:j + T] * w[:, j] for j in range(k)) + self.conv.bias  # = conv1d, without its slow backward
        return F.silu(u), z, full[:, full.shape[1] - (k - 1):]

    def parallel(self, u: Tensor) -> Tensor:
        """All outputs from an empty state by the associative scan: (B, T, D) -> (B, T, D)."""
        a_bar, b_bar, C = self.discretise(u)
        a_bar = a_bar.expand(*u.shape, -1)  # (B, T, D, N)
        h = associative_scan(a_bar, b_bar * u[..., None], dim=1)  # (B, T, D, N)
        return (h * C).sum(-1) + self.D * u

    def convolution(self, u: Tensor) -> Tensor:
        """The time-invariant layer as one causal convolution, y = K * u + D u (S4's eq. 3): (B, T, D) -> (B, T, D)."""
        if self.cfg.ssm_selective:
            raise ConfigError("ssm_selective=True: Δ, B and C change with every token, so no single kernel K exists; "
                              "compute the layer with parallel() (the scan) or recurrent(), or set ssm_selective=False.")
        a_bar, b_bar, C = (t[0, 0] for t in self.discretise(u))  # (D, N) each: the same at every step
        return causal_conv(u, lti_kernel(a_bar, b_bar, C, u.shape[1])) + self.D * u

    def recurrent(self, u: Tensor, h: Optional[Tensor]) -> tuple[Tensor, Tensor]:
        """Token by token from state h (B, D, N) (None = zeros): the decoding path."""
        a_bar, b_bar, C = self.discretise(u)
        a_bar, b_bar, C = (t.expand(*u.shape, -1) for t in (a_bar, b_bar, C))  # (B, T, D, N)
        h = u.new_zeros(*u.shape[::2], self.cfg.ssm_state) if h is None else h  # (B, D, N)
        ys = []
        for t in range(u.shape[1]):
            h = a_bar[:, t] * h + b_bar[:, t] * u[:, t, :, None]
            ys.append((h * C[:, t]).sum(-1) + self.D * u[:, t])
        return torch.stack(ys, dim=1), h

    def forward(self, x: Tensor, kv: Optional[Tensor] = None, *, causal: bool = True, key_padding_mask=None,
                attn_mask=None, cache: Optional[RecurrentState] = None, positions=None, prefix: int = 0) -> Tensor:
        check_call(self.name, kv, causal, key_padding_mask, attn_mask, prefix, cache)
        if x.shape[-1] != self.cfg.d_model:
            raise ConfigError(f"the 'ssm' mixer expects (batch, time, d_model={self.cfg.d_model}), got {tuple(x.shape)}.")
        if cache is None:
            u, z, _ = self.inputs(x)
            y = self.parallel(u)
        else:
            state = cache.state or (None,)
            h, conv_state = state[0], (state[1] if len(state) > 1 else None)
            u, z, conv_state = self.inputs(x, conv_state)
            y, h = self.recurrent(u, h)
            cache.state = (h,) if conv_state is None else (h, conv_state)
            cache.seen += x.shape[1]
        return self.w_o(y * F.silu(z))
# --8<-- [end:ssm]
