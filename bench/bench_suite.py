"""Benchmark: how long the proof suite takes, per proof file and in all, against a fixed reference workload.

    python bench/bench_suite.py                 # every proof, one process, one torch thread
    python bench/bench_suite.py proofs/blocks   # some of them
    python bench/bench_suite.py --workers 2     # also the wall time of `pytest -n 2`, as `make proofs` runs it

Seconds alone mean little across machines, so the same process first times a fixed workload (a small
Transformer trained for a fixed number of steps, one thread) and every figure is also printed in units of
it ("ref"): a suite that takes 40 ref here takes about 40 ref on a machine twice as slow. The evidence of
this run goes to a scratch folder, so the site's evidence is left alone.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def reference_workload() -> float:
    """Seconds of 60 Adam steps of a 2-layer d=64 encoder on a fixed batch, one thread (median of 3)."""
    import torch

    from proofs.tasks import reverse_task
    from proofs.train import fixed_batches, train
    from proofs.transformer import EncoderTagger, TransformerConfig

    times = []
    for _ in range(3):
        torch.manual_seed(0)
        model = EncoderTagger(TransformerConfig(vocab_size=16, d_model=64, n_heads=4, d_ff=128, dropout_emb=0.0,
                                                dropout_residual=0.0))
        batches = fixed_batches(reverse_task, 0, batch=32, length=16, vocab=16, shared=False)  # drawn in the timing
        t = time.perf_counter()
        train(model, batches, 60)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


class Durations:
    """A pytest plugin that keeps every test's call duration."""

    def __init__(self):
        self.tests: dict[str, float] = {}
        self.failed: list[str] = []

    def pytest_runtest_logreport(self, report):
        if report.when == "call":
            self.tests[report.nodeid] = report.duration
            if report.failed:
                self.failed.append(report.nodeid)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("targets", nargs="*", default=["proofs"])
    ap.add_argument("--workers", type=int, default=0, help="also time `pytest -n WORKERS` (wall) in a subprocess")
    args = ap.parse_args()
    os.environ["PROOF_THREADS"] = "1"
    os.environ.setdefault("MPLBACKEND", "Agg")
    import pytest
    import torch

    torch.set_num_threads(1)
    ref = reference_workload()
    print(f"reference workload: {ref:.3f} s (= 1 ref) on this machine, torch {torch.__version__}, 1 thread")
    with tempfile.TemporaryDirectory(prefix="bench-suite-") as tmp:
        os.environ["PROOF_EVIDENCE_DIR"] = tmp
        plugin = Durations()
        t0 = time.perf_counter()
        pytest.main([*args.targets, "-q", "-p", "no:cacheprovider", "--tb=no", "-o", "console_output_style=classic"],
                    plugins=[plugin])
        sequential = time.perf_counter() - t0
        wall = None
        if args.workers:
            t0 = time.perf_counter()
            subprocess.run([sys.executable, "-m", "pytest", *args.targets, "-n", str(args.workers), "--dist", "loadfile", "-q",
                            "-p", "no:cacheprovider", "--tb=no"], cwd=ROOT, capture_output=True,
                           env={**os.environ, "PROOF_THREADS": ""})
            wall = time.perf_counter() - t0
    per_file: dict[str, float] = {}
    for nodeid, sec in plugin.tests.items():
        per_file[nodeid.split("::")[0]] = per_file.get(nodeid.split("::")[0], 0.0) + sec
    print(f"\n{'proof file':<58} {'tests':>5} {'s':>7} {'ref':>7}")
    for f, sec in sorted(per_file.items(), key=lambda kv: -kv[1]):
        n = sum(1 for k in plugin.tests if k.startswith(f + "::"))
        print(f"{f:<58} {n:>5} {sec:>7.1f} {sec / ref:>7.1f}")
    total = sum(plugin.tests.values())
    print(f"{'all proof tests (calls only)':<58} {len(plugin.tests):>5} {total:>7.1f} {total / ref:>7.1f}")
    print(f"{'one process, with collection and imports':<58} {'':>5} {sequential:>7.1f} {sequential / ref:>7.1f}")
    if wall is not None:
        print(f"{f'pytest -n {args.workers}, wall':<58} {'':>5} {wall:>7.1f} {wall / ref:>7.1f}")
    print("\nten slowest proof tests:")
    for nodeid, sec in sorted(plugin.tests.items(), key=lambda kv: -kv[1])[:10]:
        print(f"  {sec:6.2f} s  {sec / ref:5.1f} ref  {nodeid}")
    if plugin.failed:
        print(f"\n{len(plugin.failed)} failed: {plugin.failed[:5]}")
    return 1 if plugin.failed else 0


if __name__ == "__main__":
    sys.exit(main())
