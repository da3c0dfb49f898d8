"""Position-wise feed-forward blocks: the 2017 FFN, the GLU family (SwiGLU, GEGLU) and a mixture of experts.

    dense:  FFN(x) = act(x W1 + b1) W2 + b2                          (Vaswani et al. 2017, eq. 2)
    gated:  FFN(x) = (act(x W1) ⊙ x V) W2                            (Shazeer 2020; SwiGLU: act = SiLU)
    MoE:    y = Σ_{e in top-k(router(x))} g_e(x) · FFN_e(x)          (Shazeer et al. 2017; Switch, Mixtral)
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from .config import ConfigError, TransformerConfig

ACTIVATIONS = {
    "relu": nn.ReLU,
    "gelu": nn.GELU,  # exact: x·Φ(x)
    "gelu_tanh": lambda: nn.GELU(approximate="tanh"),  # 0.5x(1 + tanh(√(2/π)(x + 0.044715x³)))
    "silu": nn.SiLU,  # x·σ(x), "swish"
}


# --8<-- [start:ffn]
class FeedForward(nn.Module):
    """FFN(x) = act(x W1 + b1) W2 + b2, the same weights at every position; gated: (act(x W1) ⊙ x V) W2."""

    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.lin1 = nn.Linear(cfg.d_model, cfg.d_ff, bias=cfg.bias)
        self.gate = nn.Linear(cfg.d_model, cfg.d_ff, bias=cfg.bias) if cfg.ffn_gated else None  # V of the GLU
        self.lin2 = nn.Linear(cfg.d_ff, cfg.d_model, bias=cfg.bias)
        self.act = ACTIVATIONS[cfg.activation]()
        self.drop_ffn = nn.Dropout(cfg.dropout_ffn)

    def forward(self, x: Tensor) -> Tensor:
        h = self.act(self.lin1(x))  # (..., d_ff)
        if self.gate is not None:
            h = h * self.gate(x)  # the linear branch gates the activated one
        return self.lin2(self.drop_ffn(h))
# --8<-- [end:ffn]


# --8<-- [start:moe]
class MoEFeedForward(nn.Module):
    """Top-k mixture of experts: a linear router scores E experts per token, the k best run, their outputs are
    summed with the router's softmax probabilities, renormalised over those k when k > 1 (Mixtral: a softmax over
    the top-k logits). With k = 1 the gate is the raw probability p_e(x) (Switch Transformer, eq. 2): renormalised
    it would always be 1 and the router would get no gradient from the task loss.

    Capacity (Switch Transformer, Fedus et al. 2021): with moe_capacity = c > 0 each expert takes at most
    ceil(c · tokens · k / E) tokens, first come first served; the rest of its tokens are dropped (that
    expert adds nothing for them; the residual stream carries them on). After every call `stats` holds the
    router probabilities, the chosen experts, the tokens each expert took and how many were dropped, and
    `aux_loss` the Switch load-balancing loss E · Σ_e f_e · P_e (1 at a uniform load, E when one expert takes all).
    """

    def __init__(self, cfg: TransformerConfig):
        super().__init__()
        self.n_experts, self.top_k, self.capacity_factor = cfg.moe_experts, cfg.moe_top_k, cfg.moe_capacity
        self.router = nn.Linear(cfg.d_model, cfg.moe_experts, bias=False)
        self.experts = nn.ModuleList(FeedForward(cfg) for _ in range(cfg.moe_experts))
        self.stats: dict = {}
        self.aux_loss = torch.zeros(())

    def forward(self, x: Tensor) -> Tensor:
        shape = x.shape
        flat = x.reshape(-1, shape[-1])  # (N, C): every token on its own
        N, E, k = flat.shape[0], self.n_experts, self.top_k
        probs = torch.softmax(self.router(flat), dim=-1)  # (N, E)
        top_p, top_e = probs.topk(k, dim=-1)  # (N, k) each
        gates = top_p / top_p.sum(-1, keepdim=True) if k > 1 else top_p  # renormalised over the chosen k (k > 1)
        capacity = math.ceil(self.capacity_factor * N * k / E) if self.capacity_factor > 0 else N * k
        chosen = top_e.flatten()  # (N·k,) the expert of every (token, slot) assignment, token by token
        order = chosen.argsort(stable=True)  # assignments grouped by expert, in token order within each group
        counts = torch.bincount(chosen, minlength=E)  # (E,) assignments per expert
        token, gate = order // k, gates.flatten()[order]  # token and gate of each sorted assignment
        rows, outs, start = [], [], 0
        for expert, n in zip(self.experts, counts.tolist()):
            take = min(n, capacity)  # first come, first served: the rest of this expert's tokens are dropped
            if take:
                idx = token[start:start + take]
                rows.append(idx)
                outs.append(gate[start:start + take, None] * expert(flat[idx]))
            start += n
        out = torch.zeros_like(flat)
        if outs:
            out = out.index_add(0, torch.cat(rows), torch.cat(outs))
        taken = counts.clamp(max=capacity)
        f = counts.float() / (N * k)  # share of assignments per expert
        self.aux_loss = E * (f * probs.mean(0)).sum()  # differentiable through P_e = mean router probability
        self.stats = {"probs": probs.detach(), "experts": top_e, "taken": taken, "dropped": int(N * k - taken.sum()),
                      "capacity": capacity}
        return out.view(shape)
# --8<-- [end:moe]


def make_ffn(cfg: TransformerConfig) -> nn.Module:
    if cfg.moe_capacity and not cfg.moe_experts:
        raise ConfigError(f"moe_capacity={cfg.moe_capacity} caps the tokens per expert of a mixture of experts, but "
                          f"moe_experts=0 builds a dense FFN. Set moe_experts > 0, or moe_capacity=0.")
    return MoEFeedForward(cfg) if cfg.moe_experts else FeedForward(cfg)
