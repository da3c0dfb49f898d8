"""Set-up of the hybrids page (docs/beyond/hybrids.md): tiny mixer stacks trained on fused MQAR, and their decoding memory.

A stack is a tuple of mixer names, one per layer (MixerConfig.mixer), e.g. ("linear", "softmax"). Every stack has the
same width, FFN, embeddings, steps, learning rate and batches (one seed gives every arm the same data); only the mixer
of each layer changes. The task is MQAR in the fused format of proofs/mqar.py (one token per key-value pair), so one
layer can retrieve and the few hundred steps the budget allows go to retrieval, not to the previous-token step that
Zoology's two-token format needs first (a 2-layer model took ~800 steps on it, see proofs/mqar.py).

Training mixes the pair counts PAIRS, one count per step (step s stores PAIRS[s mod len(PAIRS)] pairs), as
proofs/recall_curves.py does for single layers: one run learns the task at every count, and recall is then measured
at each count on held-out batches, so every stack gives a curve of recall against pairs, not one number.

The recipe (searched on one CPU thread, 2026-11-27): d_model 8 with ONE head, so linear attention's state is one 8×8
matrix (plus an 8-vector normaliser) and the selective SSM's 8 channels × 8 states: 64 numbers per layer either way;
16 keys, 4 values (64 pair tokens), 16 queries per sequence, pairs 2…16 (up to 2d), positions "none" (retrieval is
by content), pre-norm, no dropout, untied embeddings, Adam lr 1e-2, batch 64, 200 steps (about 1.5 s per attention
or linear stack, 5 s for the SSM stack, on one thread). Seed 100 of the search: all-softmax 0.91 → 0.88 from 2 to 16
pairs, softmax + linear 0.90 → 0.89, all-linear 0.77 → 0.43, all-SSM 0.65 → 0.41. What did not work: one pair count
per run (16 pairs, 150 steps: single attention runs spread from 0.35 to 0.91 over seeds, some had not learned to
retrieve); d_model 16 (the SSM stack took 20 s); the linear layer BELOW the softmax layer learned more slowly than
softmax first (both recipes); lr 2e-2 or 3e-2 (softmax worse).
"""

from __future__ import annotations

import time

import torch

from .mqar import mqar, mqar_vocab, recall
from .train import train
from .transformer.mixers import MixerConfig, mixer_lm, state_bytes

KEYS, VALUES, QUERIES = 16, 4, 16  # keys to draw pairs from, values, queries per sequence
WIDTH = 8  # d_model = the state's side: one head, d_head = 8
PAIRS = (2, 4, 8, 12, 16)  # pair counts trained on (cycled, one per step) and measured: up to 2 · WIDTH
STEPS, LR, BATCH, TEST_BATCH = 200, 1e-2, 64, 256


def config(stack: tuple, n_pairs: int = max(PAIRS), d_model: int = WIDTH, **kw) -> MixerConfig:
    base = dict(vocab_size=mqar_vocab(KEYS, VALUES, fused=True), d_model=d_model, n_heads=1, d_ff=2 * d_model,
                n_layers=len(stack), max_len=n_pairs + QUERIES, positions="none", norm_position="pre",
                dropout_emb=0.0, dropout_residual=0.0, tie_embeddings="none", scale_embeddings=False,
                attn_impl="explicit", mixer=tuple(stack), ssm_state=d_model)
    return MixerConfig(**{**base, **kw})


def trained_curve(stack: tuple, seed: int, steps: int = STEPS, lr: float = LR, d_model: int = WIDTH) -> dict:
    """Train `stack` on fused MQAR with the pair counts PAIRS mixed (one count a step, the same stream for every
    stack of a seed); recall at each count on held-out batches."""
    torch.manual_seed(seed)
    model = mixer_lm(config(stack, d_model=d_model))
    g, cache = torch.Generator().manual_seed(seed), []

    def batches(step: int):
        while len(cache) <= step:
            cache.append(mqar(g, BATCH, PAIRS[len(cache) % len(PAIRS)], QUERIES, KEYS, VALUES, fused=True))
        return cache[step]

    t0 = time.perf_counter()
    log = train(model, batches, steps, lr=lr)
    seconds = time.perf_counter() - t0
    curve = {}
    for n in PAIRS:
        x, y = mqar(torch.Generator().manual_seed(seed + 10_000 + n), TEST_BATCH, n, QUERIES, KEYS, VALUES, fused=True)
        curve[n] = recall(model, x, y)
    return {"recall": curve, "loss": log.final(), "seconds": seconds,
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
    stacks = [("softmax", "softmax"), ("softmax", "linear"), ("linear", "linear"), ("ssm", "ssm")]
    for seed in [int(a) for a in sys.argv[1].split(",")] if len(sys.argv) > 1 else [100]:
        for s in stacks:
            r = trained_curve(s, seed)
            print(seed, s, {n: round(v, 3) for n, v in r["recall"].items()}, f"{r['seconds']:.1f} s", flush=True)
