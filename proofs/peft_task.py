"""The toy adaptation task of docs/generation/lora.md, as a module a proof may import.

proofs/generation/proof_lora.py builds its set-up inside the proof file (and a proof never imports another proof),
so this module rebuilds the same task from proofs/tasks.py with the same constants: a small Pre-LN DecoderLM
(d_model 32, 4 heads, 2 layers, d_ff 64, learned positions, max_len 16) trained for 200 Adam steps (lr 3e-3) to
copy the previous token, then adapted to copy the token two back. `base_model(seed)` at width 32 is the same
model as the LoRA page's (same seeds, same batches); other widths keep d_ff = 2·d_model and 4 heads.
"""

from __future__ import annotations

import functools

import torch

from proofs.tasks import previous_token_task, random_tokens
from proofs.train import fixed_batches, train
from proofs.transformer import DecoderLM, TransformerConfig

VOCAB, T, BATCH = 32, 16, 32
PRE_STEPS, ADAPT_STEPS = 200, 100


def two_back_task(g: torch.Generator, batch: int, length: int, vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The adaptation target: predict the token two positions back (the base model learnt one back).
    x, y: (batch, length) ids; y[:, t] = x[:, t-2] (positions 0-1 copy themselves and are not scored)."""
    x = random_tokens(g, batch, length, vocab)
    return x, torch.cat([x[:, :2], x[:, :-2]], dim=1)


def base_config(d_model: int = 32) -> TransformerConfig:
    return TransformerConfig(vocab_size=VOCAB, d_model=d_model, n_heads=4, n_layers=2, d_ff=2 * d_model,
                             norm_position="pre", positions="learned", max_len=T, dropout_emb=0.0,
                             dropout_residual=0.0)


@functools.lru_cache(maxsize=None)
def base_model(seed: int, d_model: int = 32) -> DecoderLM:
    """A small Pre-LN DecoderLM trained to copy the previous token (cached: callers deep-copy it)."""
    torch.manual_seed(seed)
    model = DecoderLM(base_config(d_model))
    train(model, fixed_batches(previous_token_task, 100 + seed, BATCH, T, VOCAB), PRE_STEPS, lr=3e-3)
    return model.eval()


def adaptation_batches(seed: int):
    """The same 100 batches of the two-back task for every arm (as on the LoRA page)."""
    return fixed_batches(two_back_task, 200 + seed, BATCH, T, VOCAB)


@torch.no_grad()
def accuracy(model, task, seed: int) -> float:
    """Share of positions 2.. whose argmax is the target, on 256 held-out sequences of `task`."""
    x, y = task(torch.Generator().manual_seed(9_000 + seed), 256, T, VOCAB)
    model.eval()
    return (model(x).argmax(-1)[:, 2:] == y[:, 2:]).float().mean().item()
