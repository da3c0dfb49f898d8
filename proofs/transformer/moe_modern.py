"""Today's mixture of experts: fine-grained and shared experts (DeepSeekMoE) and balancing by a routing bias.

    fine-grained   each of E experts of width d_ff split into m of width d_ff/m; route to m·k of them      (Dai et al. 2024, §3.1)
    shared         n_s of those m·E always run (gate 1); the router picks m·k − n_s of the other m·E − n_s  (Dai et al. 2024, §3.2)
                   active FFN parameters stay those of k experts of width d_ff; total those of E
    routing bias   top-k chosen on s_e + b_e, gates from s_e alone; b_e += γ·sign(mean load − load_e)     (Wang et al. 2024, §3;
                   after every training step, outside autograd (b is a buffer, never a parameter)        DeepSeek-V3 §2.1.2, eq. 16)

The affinity s_e is the shared model's softmax router probability, and the gates are s_e renormalised over the
chosen experts (as `MoEFeedForward` does for k > 1). DeepSeek-V3 uses sigmoid affinities normalised over the chosen
ones (§2.1.2, eqs. 13-15); DeepSeekMoE a softmax without renormalisation (§3.1, eq. 7); Wang et al. gate by s_e
itself (§3, eq. 3; s_e = G(u·e_e) with G a nonlinear gating function). Either way the bias only moves the choice.
The update here runs once per training forward, after the routing, from that batch's load, so it acts on the next
batch (as Wang et al.'s Algorithm 1: the current sequence's own load is not used, which would leak future tokens);
with gradient accumulation it would run once per micro-batch.
`bias_in_gates=True` is the switch a test flips: the biased score is used for the gates too.

`DeepSeekMoE` subclasses `MoEFeedForward`: the routed experts are its `experts` (shared `FeedForward` modules of
width d_ff/m), built by its constructor from a config with the fine-grained sizes; the `n_s` shared experts are one
`FeedForward` of width n_s·d_ff/m (the sum of n_s FFNs of width d_ff/m is exactly one FFN of the summed width, as
DeepSeek-V3's code builds them). The forward is its own because the choice and the gates now come from different
scores; with m = 1, n_s = 0 and a zero bias it equals `MoEFeedForward` bit for bit (tested). No capacity limit.
`aux_loss` (Switch's E·Σ f·P) and `stats` are kept as in `MoEFeedForward`, so `DecoderLM.aux_loss()` and the
trainer's `extra_loss` work unchanged; `stats["max_vio"]` is the batch's maximal violation (max load − mean) / mean
(Wang et al. 2024, §4.1, eq. 4 define it as MaxVio_global on the validation set; per training batch it is their
MaxVio_batch).

These options are not fields of `TransformerConfig`: editing config.py would mark every proof's evidence stale, so
`apply_deepseek_moe(model, ...)` swaps a built DecoderLM's MoE layers instead (as peft.py swaps attributes).
"""

from __future__ import annotations

import torch
import torch.nn as nn
from torch import Tensor

from .config import ConfigError, TransformerConfig
from .feedforward import FeedForward, MoEFeedForward


def fine_grained_config(cfg: TransformerConfig, granularity: int = 1, n_shared: int = 0) -> TransformerConfig:
    """The routed part of DeepSeekMoE as an MoE config: m·E − n_s experts of width d_ff/m, top m·k − n_s."""
    m, E, k = granularity, cfg.moe_experts, cfg.moe_top_k
    if not E:
        raise ConfigError("DeepSeekMoE splits the experts of a mixture of experts: set moe_experts > 0.")
    if m < 1 or cfg.d_ff % m:
        raise ConfigError(f"granularity={m} must be a positive divisor of d_ff={cfg.d_ff} (experts of width d_ff/m).")
    if not 0 <= n_shared < m * k:
        raise ConfigError(f"n_shared={n_shared} must lie in [0, m·k = {m * k}): the shared experts come out of the m·k "
                          f"active ones, and at least one must stay routed. Lower n_shared or raise granularity.")
    if cfg.moe_capacity:
        raise ConfigError("DeepSeekMoE here has no capacity limit: set moe_capacity=0.")
    return cfg.replace(d_ff=cfg.d_ff // m, moe_experts=m * E - n_shared, moe_top_k=m * k - n_shared)


# --8<-- [start:module]
class DeepSeekMoE(MoEFeedForward):
    """Fine-grained routed experts, optional always-on shared experts, optional routing bias for the choice only."""

    def __init__(self, cfg: TransformerConfig, granularity: int = 1, n_shared: int = 0, balance_rate: float = 0.0,
                 bias_in_gates: bool = False):
        fine = fine_grained_config(cfg, granularity, n_shared)
        super().__init__(fine)  # router (d → m·E − n_s) and the routed experts, width d_ff/m
        self.shared = FeedForward(fine.replace(d_ff=n_shared * fine.d_ff)) if n_shared else None  # gate 1 for all
        self.granularity, self.n_shared = granularity, n_shared
        self.balance_rate, self.bias_in_gates = balance_rate, bias_in_gates  # γ; the switch (bias in the gates too)
        self.register_buffer("route_bias", torch.zeros(fine.moe_experts))  # b_e: a buffer, so no optimiser or grad

    def route(self, flat: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """(probs (N, E), chosen experts (N, k), gates (N, k)): chosen on s + b, gated by s (or s + b: the switch)."""
        probs = torch.softmax(self.router(flat), dim=-1)  # (N, E) affinities s
        biased = probs + self.route_bias  # the bias enters only here ...
        top_e = biased.topk(self.top_k, dim=-1).indices  # (N, k)
        top_s = (biased if self.bias_in_gates else probs).gather(1, top_e)  # ... and not the gate (unless switched)
        gates = top_s / top_s.sum(-1, keepdim=True) if self.top_k > 1 else top_s
        return probs, top_e, gates

    def forward(self, x: Tensor) -> Tensor:
        shape = x.shape
        flat = x.reshape(-1, shape[-1])  # (N, C)
        N, E, k = flat.shape[0], self.n_experts, self.top_k
        probs, top_e, gates = self.route(flat)
        chosen = top_e.flatten()  # (N·k,) as in MoEFeedForward: assignments grouped by expert, token order within
        order = chosen.argsort(stable=True)
        counts = torch.bincount(chosen, minlength=E)  # (E,) load
        token, gate = order // k, gates.flatten()[order]
        outs, start = [], 0
        for expert, n in zip(self.experts, counts.tolist()):
            if n:
                outs.append(gate[start:start + n, None] * expert(flat[token[start:start + n]]))
            start += n
        out = torch.zeros_like(flat).index_add(0, token, torch.cat(outs))  # every assignment has an expert (no capacity)
        if self.shared is not None:
            out = out + self.shared(flat)  # every token, gate 1
        f = counts.float() / (N * k)
        self.aux_loss = E * (f * probs.mean(0)).sum()  # Switch's loss, as MoEFeedForward (used by the α arms)
        mean_load = counts.float().mean()
        self.stats = {"probs": probs.detach(), "experts": top_e, "taken": counts, "dropped": 0, "capacity": N * k,
                      "max_vio": ((counts.max() - mean_load) / mean_load).item()}
        if self.training and self.balance_rate:
            with torch.no_grad():  # outside autograd: b_e += γ·sign(mean load − load_e)
                self.route_bias += self.balance_rate * torch.sign(mean_load - counts.float())
        return out.view(shape)
# --8<-- [end:module]


def apply_deepseek_moe(model: nn.Module, granularity: int = 1, n_shared: int = 0, balance_rate: float = 0.0,
                       bias_in_gates: bool = False) -> list[DeepSeekMoE]:
    """Replace every MoE FFN of a built DecoderLM (cfg.moe_experts > 0) by a DeepSeekMoE of the same E, k, d_ff.
    New weights are drawn (Xavier-uniform, as init_weights does with depth_init='none'); returns the new layers."""
    cfg = model.cfg
    if cfg.depth_init != "none":
        raise ConfigError(f"apply_deepseek_moe initialises the new experts without depth scaling: build the model "
                          f"with depth_init='none' (got {cfg.depth_init!r}).")
    layers = [layer for layer in model.decoder.layers if isinstance(layer.ffn, MoEFeedForward)]
    if not layers:
        raise ConfigError("apply_deepseek_moe replaces mixture-of-experts FFNs: build the model with moe_experts > 0.")
    new = []
    for layer in layers:
        moe = DeepSeekMoE(cfg, granularity, n_shared, balance_rate, bias_in_gates)
        for p in moe.parameters():
            if p.dim() == 2:
                nn.init.xavier_uniform_(p)
        layer.ffn = moe
        new.append(moe)
    return new
