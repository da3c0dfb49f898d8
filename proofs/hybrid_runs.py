"""Set-up of the hybrids page (docs/beyond/hybrids.md): tiny mixer stacks trained on fused MQAR, and their decoding memory.

A stack is a tuple of mixer names, one per layer (MixerConfig.mixer), e.g. ("linear", "softmax"). Every stack has the
same width, FFN, embeddings, steps, learning rate and batches (one seed gives every arm the same data); only the mixer
of each layer changes. The task is MQAR in the fused format of proofs/mqar.py (one token per key-value pair), so one
layer can retrieve and the few hundred steps the budget allows go to retrieval, not to the previous-token step that
Zoology's two-token format needs first (a 2-layer model took ~800 steps on it, see proofs/mqar.py).

The recipe (searched on one CPU thread, seed 100-104, 2026-11-27): d_model 8 with ONE head, so linear attention's
state is one 8×8 matrix (plus an 8-vector normaliser) and the selective SSM's 8 channels × 8 states: 64 numbers per
layer either way; 16 keys, 4 values (64 pair tokens), 16 queries per sequence, 2d = 16 pairs; positions "none"
(retrieval is by content), pre-norm, no dropout, untied embeddings, Adam lr 1e-2, batch 64, 150 steps (~1.5 s per
attention or linear stack, ~4 s for the SSM stack on a loaded machine). What did not work within the budget:
d_model 16 with 32 keys × 8 values (256 pair tokens: softmax 0.39 recall at 32 pairs after 200 steps); lr 2e-2 or
3e-2 (softmax worse); the linear layer BELOW the softmax layer (0.43-0.52 where softmax-first got 0.62-0.81); batch 32
(noisier). At 150 steps the stacks are not converged: even the all-linear stack at 4 pairs recalled only 0.39-0.54,
so the trained comparison is one of equal budgets, not of converged capacities.
"""

from __future__ import annotations

import time

import torch

from .mqar import mqar, mqar_batches, mqar_vocab, recall
from .train import train
from .transformer.mixers import MixerConfig, mixer_lm, state_bytes

KEYS, VALUES, QUERIES = 16, 4, 16  # keys to draw pairs from, values, queries per sequence
WIDTH = 8  # d_model = the state's side: one head, d_head = 8
STEPS, LR, BATCH = 150, 1e-2, 64


def config(stack: tuple, n_pairs: int, d_model: int = WIDTH, **kw) -> MixerConfig:
    base = dict(vocab_size=mqar_vocab(KEYS, VALUES, fused=True), d_model=d_model, n_heads=1, d_ff=2 * d_model,
                n_layers=len(stack), max_len=n_pairs + QUERIES, positions="none", norm_position="pre",
                dropout_emb=0.0, dropout_residual=0.0, tie_embeddings="none", scale_embeddings=False,
                attn_impl="explicit", mixer=tuple(stack), ssm_state=d_model)
    return MixerConfig(**{**base, **kw})


def trained_recall(stack: tuple, n_pairs: int, seed: int, steps: int = STEPS, lr: float = LR, batch: int = BATCH,
                   d_model: int = WIDTH, test_batch: int = 256) -> dict:
    """Train `stack` on fused MQAR with n_pairs pairs; recall on a fresh held-out batch."""
    torch.manual_seed(seed)
    model = mixer_lm(config(stack, n_pairs, d_model))
    batches = mqar_batches(seed, batch, n_pairs, QUERIES, KEYS, VALUES, fused=True)
    t0 = time.perf_counter()
    log = train(model, batches, steps, lr=lr)
    x, y = mqar(torch.Generator().manual_seed(seed + 10_000), test_batch, n_pairs, QUERIES, KEYS, VALUES, fused=True)
    return {"recall": recall(model, x, y), "loss": log.final(), "seconds": time.perf_counter() - t0,
            "params": sum(p.numel() for p in model.parameters())}


@torch.no_grad()
def decode_bytes(stack: tuple, lengths: tuple, seed: int = 0, d_model: int = WIDTH) -> dict:
    """Decoding memory (state_bytes of mixer_lm's caches) after each length, decoding one token at a time, and the
    last step's logits against one full forward pass."""
    torch.manual_seed(seed)
    model = mixer_lm(config(stack, max(lengths), d_model)).double().eval()
    ids = torch.randint(0, model.cfg.vocab_size, (1, max(lengths)), generator=torch.Generator().manual_seed(seed))
    cache, at, last = model.decoder.new_cache(), {}, None
    for t in range(max(lengths)):
        last = model(ids[:, t:t + 1], cache=cache)[:, -1]
        if t + 1 in lengths:
            at[t + 1] = state_bytes(cache)
    return {"bytes": at, "decode vs full forward": (last - model(ids)[:, -1]).abs().max().item()}


if __name__ == "__main__":
    import sys

    torch.set_num_threads(1)
    stacks = [("softmax", "softmax"), ("linear", "linear"), ("ssm", "ssm"), ("linear", "softmax")]
    pairs = [int(a) for a in sys.argv[1].split(",")] if len(sys.argv) > 1 else [4, 32]
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else STEPS
    for n in pairs:
        for s in stacks:
            r = trained_recall(s, n, 100, steps=steps)
            print(n, s, {k: round(v, 3) for k, v in r.items()}, flush=True)
