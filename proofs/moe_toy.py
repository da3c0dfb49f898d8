"""The toy for today's mixtures of experts (docs/blocks/moe-today.md): the section's order-2 language model
(proofs/block_lm.py) with one layer whose FFN is a mixture of experts, as in docs/blocks/mixture-of-experts.md §5,
but with the FFN swapped for `DeepSeekMoE` (proofs/transformer/moe_modern.py) so that every arm, the plain top-k
layer included, is the same module with other settings.

One run: seed → DecoderLM(block_cfg(n_layers=1, moe_experts=E, moe_top_k=k, d_ff=W)), the MoE layer replaced by
apply_deepseek_moe(granularity, n_shared, balance_rate), trained with proofs.train.train on the same batches as the
other arms of that seed (Adam, lr 5e-3, STEPS steps of 16 sequences of 16 tokens), alpha · (Switch loss) added when
alpha > 0. Recorded: the batch's maximal load violation at every step (MaxVio = (max load − mean load) / mean load,
Wang et al. 2024; 0 = even), the held-out loss on 512 sequences, MaxVio on those held-out tokens, and the mean
pairwise cosine between the routed experts' outputs on the held-out tokens (what the experts compute, compared
in function space: raw weight vectors of two experts are not comparable, since their hidden units can be permuted).
"""

from __future__ import annotations

import functools
import itertools

import torch
import torch.nn.functional as F

from proofs.block_lm import BATCH, LENGTH, LR, V, block_cfg, markov2_task
from proofs.train import fixed_batches, token_loss, train
from proofs.transformer import DecoderLM
from proofs.transformer.moe_modern import DeepSeekMoE, apply_deepseek_moe

STEPS = 40  # 60 until 2026-11-27: cut for the 8 s budget (seeds 100-139 re-swept at 40)


def toy_cfg(E: int, k: int, width: int):
    return block_cfg(n_layers=1, moe_experts=E, moe_top_k=k, d_ff=width)


# --8<-- [start:run]
@functools.cache
def toy_run(seed: int, E: int = 8, k: int = 2, width: int = 48, granularity: int = 1, n_shared: int = 0,
            alpha: float = 0.0, gamma: float = 0.0, steps: int = STEPS) -> dict:
    """One trained arm (cached): held-out loss, MaxVio per training step and on held-out tokens, expert cosine."""
    torch.manual_seed(seed)
    model = DecoderLM(toy_cfg(E, k, width))
    (moe,) = apply_deepseek_moe(model, granularity, n_shared, balance_rate=gamma)
    vio: list[float] = []

    def extra(m):  # read after each training forward: the step's MaxVio; plus the Switch loss if alpha > 0
        vio.append(moe.stats["max_vio"])
        return alpha * moe.aux_loss if alpha else torch.zeros(())

    train(model, fixed_batches(markov2_task, 1000 + seed, BATCH, LENGTH, V), steps, lr=LR, extra_loss=extra)
    x, y = markov2_task(torch.Generator().manual_seed(10_000 + seed), 512, LENGTH)
    with torch.no_grad():
        held_out = token_loss(model(x), y).item()
        held_vio = moe.stats["max_vio"]
        cos = expert_cosine(moe, hidden_at_moe(model, x[:64]))
    return {"held_out": held_out, "vio": vio, "held_out_vio": held_vio, "cosine": cos,
            "bias": moe.route_bias.clone()}
# --8<-- [end:run]


@torch.no_grad()
def hidden_at_moe(model: DecoderLM, ids: torch.Tensor) -> torch.Tensor:
    """The inputs the MoE layer sees for ids (B, T): captured by a forward hook, flattened to (B·T, C)."""
    layer = model.decoder.layers[0]
    seen = []
    handle = layer.ffn.register_forward_hook(lambda mod, inp, out: seen.append(inp[0].reshape(-1, inp[0].shape[-1])))
    try:
        model.eval()(ids)
    finally:
        handle.remove()
    return seen[0]


@torch.no_grad()
def expert_cosine(moe: DeepSeekMoE, h: torch.Tensor) -> float:
    """Mean over pairs of routed experts of the cosine between their outputs on the same tokens h (N, C),
    each output flattened to one vector (N·C)."""
    outs = torch.stack([expert(h).flatten() for expert in moe.experts])  # (E, N·C)
    outs = F.normalize(outs, dim=-1)
    sims = [float(outs[i] @ outs[j]) for i, j in itertools.combinations(range(len(outs)), 2)]
    return sum(sims) / len(sims)
