"""Benchmark: the shared EncoderLayer against torch.nn.TransformerEncoderLayer, same configuration.

Forward + backward on the CPU, both timed in the same run, interleaved, median of several rounds.
Prints the time ratio ours / torch.nn for each configuration (target: at most 1.0).
Run: `make bench` or `python bench/bench_encoder_layer.py [--threads N] [--rounds R]`.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch import nn

from proofs.transformer import EncoderLayer, TransformerConfig


def make_pair(d_model: int, n_heads: int, d_ff: int, dropout: float, norm_first: bool):
    cfg = TransformerConfig(d_model=d_model, n_heads=n_heads, d_ff=d_ff, norm_position="pre" if norm_first else "post",
                            dropout_residual=dropout, dropout_attn=dropout, dropout_ffn=dropout)
    ours = EncoderLayer(cfg)
    ref = nn.TransformerEncoderLayer(d_model, n_heads, d_ff, dropout=dropout, batch_first=True, norm_first=norm_first)
    return ours.train(), ref.train()


def step_time(layer: nn.Module, x: torch.Tensor) -> float:
    t = time.perf_counter()
    layer(x).sum().backward()
    return time.perf_counter() - t


def bench(name: str, batch: int, length: int, rounds: int, **kw) -> float:
    torch.manual_seed(0)
    ours, ref = make_pair(**kw)
    x = torch.randn(batch, length, kw["d_model"], requires_grad=True)
    for _ in range(3):  # warm-up
        step_time(ours, x), step_time(ref, x)
    t_ours, t_ref = [], []
    for _ in range(rounds):  # interleaved, so drift in machine load hits both alike
        t_ours.append(step_time(ours, x))
        t_ref.append(step_time(ref, x))
    a, b = statistics.median(t_ours), statistics.median(t_ref)
    print(f"{name:<44} ours {a * 1e3:8.2f} ms   torch.nn {b * 1e3:8.2f} ms   ratio {a / b:5.2f}")
    return a / b


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--rounds", type=int, default=15)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {args.threads} thread(s), forward+backward, median of {args.rounds}")
    base = dict(d_model=256, n_heads=8, d_ff=1024, norm_first=False)
    ratios = [
        bench("Post-LN, dropout 0   (B=16, T=128, d=256)", 16, 128, args.rounds, dropout=0.0, **base),
        bench("Post-LN, dropout 0.1 (B=16, T=128, d=256)", 16, 128, args.rounds, dropout=0.1, **base),
        bench("Pre-LN,  dropout 0   (B=16, T=128, d=256)", 16, 128, args.rounds, dropout=0.0,
              **{**base, "norm_first": True}),
        bench("Post-LN, dropout 0   (B=8,  T=64,  d=64)", 8, 64, args.rounds, dropout=0.0,
              d_model=64, n_heads=4, d_ff=128, norm_first=False),
    ]
    print(f"worst ratio {max(ratios):.2f} (target <= 1.0)")


if __name__ == "__main__":
    main()
