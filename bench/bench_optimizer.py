"""Benchmark: the training loop's Adam, FlatAdam (proofs/optim.py) against torch.optim.Adam(foreach=True).

Three of the proofs' toys, each trained from the same initialisation on the same batches with both optimisers, in
the same run, interleaved, best of several rounds, one torch thread. Prints the time of a whole training step
(forward, backward, gradient norm, Adam) with each, their ratio FlatAdam / torch (below 1: faster), and whether the
two runs ended with bit-identical weights (they must: FlatAdam is torch's arithmetic on one buffer).
Run: `make bench` or `python bench/bench_optimizer.py [--steps N] [--rounds R]`.
"""

from __future__ import annotations

import argparse
import time

import torch

from proofs.block_lm import BATCH, LENGTH, V, block_cfg, markov2_task
from proofs.optim import FlatAdam
from proofs.tasks import lookup_task
from proofs.train import fixed_batches, grad_norm, token_loss
from proofs.transformer import DecoderLM, EncoderTagger, TransformerConfig

TOYS = {  # name -> (model builder, batches): the set-ups of proofs/block_lm.py, proofs/warmup_runs.py, GQA's page
    "block LM (2 layers, d 48, 23 tensors)": (lambda: DecoderLM(block_cfg()),
                                              lambda: fixed_batches(markov2_task, 1000, BATCH, LENGTH, V)),
    "Post-LN lookup (8 layers, d 32)": (
        lambda: EncoderTagger(TransformerConfig(vocab_size=16, d_model=32, n_heads=4, d_ff=64, n_layers=8,
                                                dropout_emb=0.0, dropout_residual=0.0)),
        lambda: fixed_batches(lookup_task, 1000, 16, 8, 16)),
    "GQA decoder (2 layers, d 32, RoPE)": (
        lambda: DecoderLM(TransformerConfig(vocab_size=16, d_model=32, n_heads=4, n_kv_heads=2, d_ff=64, n_layers=2,
                                            positions="rope", norm_position="pre", max_len=64, dropout_emb=0.0,
                                            dropout_residual=0.0)),
        lambda: fixed_batches(lookup_task, 2000, 32, 32, 16)),
}


def run(build, batches, flat: bool, steps: int) -> tuple[float, list[torch.Tensor]]:
    """Seconds of `steps` training steps, and the weights after them."""
    torch.manual_seed(0)
    model = build().train()
    params = list(model.parameters())
    kw = dict(lr=5e-3, betas=(0.9, 0.98), eps=1e-9)
    opt = FlatAdam(params, **kw) if flat else torch.optim.Adam(params, foreach=True, **kw)
    get = batches()
    data = [get(s) for s in range(steps)]  # drawn before the clock starts: only the steps are timed
    t = time.perf_counter()
    for x, y in data:
        loss = token_loss(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm(params)
        opt.step()
    return time.perf_counter() - t, [p.detach().clone() for p in params]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    torch.set_num_threads(1)
    print(f"{'toy':<40} {'torch ms/step':>13} {'flat ms/step':>12} {'flat/torch':>10}  weights")
    for name, (build, batches) in TOYS.items():
        best = {False: float("inf"), True: float("inf")}
        weights = {}
        for _ in range(args.rounds):
            for flat in (False, True):  # interleaved: both see the machine in the same state
                seconds, weights[flat] = run(build, batches, flat, args.steps)
                best[flat] = min(best[flat], seconds)
        same = all(torch.equal(a, b) for a, b in zip(weights[False], weights[True]))
        print(f"{name:<40} {1e3 * best[False] / args.steps:>13.2f} {1e3 * best[True] / args.steps:>12.2f} "
              f"{best[True] / best[False]:>10.2f}  {'identical' if same else 'DIFFER'}")
        if not same:
            return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
