"""Rerun proofs under many seeds: each test's pass rate, and the spread of everything it measured.

    python -m proofs.seeds                       # the whole suite, 20 random seeds outside 0-29
    python -m proofs.seeds proofs/attention -n 30 --jobs 2 --spread
    python -m proofs.seeds proofs/x.py -k test_y --seeds 100-139 --spread --record

A proof's statistical thresholds must hold for any seed a reader picks. This tool is how they are set
and checked: it runs pytest once per seed (one torch thread each, `--jobs` at a time), each run writing
its evidence to a scratch folder, then reads every test's outcome and measurements back and prints

  - per test: how many seeds passed, the failures' messages, the mean run time;
  - with --spread: per numeric measurement, the mean, standard deviation, minimum and maximum over the
    seeds (lists are read element by element), so a threshold can be set several standard deviations
    from the mean instead of just below the seeds one happened to try.

--record merges the result into bench/seeds/<area>/<proof>.json (one entry per test, with the code
fingerprint it ran against); the site's seed page shows them, marked stale when the proof has changed since.
Exit status 1 if any test failed on any seed.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from proofs import evidence as E

REPORTS = E.ROOT / "bench" / "seeds"  # one recorded report per proof file: bench/seeds/<area>/<proof>.json
RESERVED = range(0, 30)  # seeds used while the proofs were written: never used to check them


def report_path(proof_rel: str) -> Path:
    """bench/seeds/attention/proof_masks.json for proofs/attention/proof_masks.py."""
    return REPORTS / Path(proof_rel).relative_to("proofs").with_suffix(".json")


def parse_seeds(text: str) -> list[int]:
    out: list[int] = []
    for part in text.split(","):
        if "-" in part:
            lo, hi = map(int, part.split("-"))
            out += range(lo, hi + 1)
        elif part:
            out.append(int(part))
    return out


def random_seeds(n: int, rng_seed: int | None) -> list[int]:
    rng = random.Random(rng_seed)
    seeds: set[int] = set()
    while len(seeds) < n:
        s = rng.randrange(30, 1_000_000)
        if s not in RESERVED:
            seeds.add(s)
    return sorted(seeds)


def run_one(seed: int, targets: list[str], keyword: str | None, scratch: Path) -> tuple[int, Path, float, str]:
    out = scratch / f"seed-{seed}"
    env = {**os.environ, "PROOF_EVIDENCE_DIR": str(out), "PROOF_THREADS": "1", "OMP_NUM_THREADS": "1",
           "MPLBACKEND": "Agg"}
    cmd = [sys.executable, "-m", "pytest", *targets, "--proof-seed", str(seed), "-q", "-p", "no:cacheprovider",
           "--tb=no"]
    if keyword:
        cmd += ["-k", keyword]
    t0 = time.perf_counter()
    r = subprocess.run(cmd, cwd=E.ROOT, env=env, capture_output=True, text=True)
    return seed, out, time.perf_counter() - t0, r.stdout[-2000:] + r.stderr[-2000:]


def numbers(value) -> list[float]:
    if isinstance(value, bool):
        return [float(value)]
    if isinstance(value, (int, float)):
        return [float(value)]
    if isinstance(value, list):
        return [x for v in value for x in numbers(v)]
    return []


def collect(results: list[tuple[int, Path, float, str]]) -> dict[str, dict]:
    """test id -> {seeds, passed, failures, seconds, measurements: name -> [values]}"""
    tests: dict[str, dict] = {}
    for seed, folder, _, _ in results:
        for path in sorted(folder.rglob("*.json")):
            doc = json.loads(path.read_text(encoding="utf-8"))
            tid = f"{doc['proof']}::{doc['test']}"
            t = tests.setdefault(tid, {"proof": doc["proof"], "test": doc["test"], "seeds": [], "passed": 0,
                                       "failures": [], "seconds": [], "measurements": {},
                                       "fingerprint": doc["provenance"]["fingerprint"]})
            t["seeds"].append(seed)
            t["seconds"].append(doc["provenance"]["seconds"])
            if doc["outcome"] == "passed":
                t["passed"] += 1
            else:
                t["failures"].append({"seed": seed, "message": doc.get("failure", "")[:300]})
            for m in doc["measurements"]:
                vals = numbers(m["value"])
                if vals:
                    t["measurements"].setdefault(m["name"], []).extend(vals)
    return tests


def summary(vals: list[float]) -> dict:
    return {"n": len(vals), "mean": statistics.fmean(vals), "sd": statistics.pstdev(vals) if len(vals) > 1 else 0.0,
            "min": min(vals), "max": max(vals)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("targets", nargs="*", default=["proofs"], help="proof files or folders (default: all proofs)")
    ap.add_argument("-n", type=int, default=20, help="number of random seeds (default 20)")
    ap.add_argument("--seeds", help="explicit seeds instead, e.g. 100-139 or 5,77,1234")
    ap.add_argument("--rng-seed", type=int, default=None, help="make the random choice of seeds repeatable")
    ap.add_argument("-k", dest="keyword", help="pytest -k expression: only these tests")
    ap.add_argument("--jobs", type=int, default=max(1, (os.cpu_count() or 2)), help="seeds run at once")
    ap.add_argument("--spread", action="store_true", help="print each measurement's spread over the seeds")
    ap.add_argument("--record", action="store_true", help="merge the result into bench/seeds/<area>/<proof>.json")
    ap.add_argument("--json", type=Path, help="also write the full result to this file")
    args = ap.parse_args(argv)

    seeds = parse_seeds(args.seeds) if args.seeds else random_seeds(args.n, args.rng_seed)
    print(f"seeds ({len(seeds)}): {', '.join(map(str, seeds))}", flush=True)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="proof-seeds-") as tmp:
        done = []
        with ThreadPoolExecutor(max_workers=args.jobs) as pool:
            for i, res in enumerate(pool.map(lambda s: run_one(s, args.targets, args.keyword, Path(tmp)), seeds), 1):
                done.append(res)
                print(f"  [{i}/{len(seeds)}] seed {res[0]}: {res[2]:.0f} s", flush=True)
        tests = collect(done)
        if not tests:
            print("no evidence was written; pytest said:\n" + done[0][3])
            return 2
    wall = time.perf_counter() - t0

    failed_any = False
    print(f"\n{'test':<78} {'passed':>9} {'s/seed':>7}")
    for tid in sorted(tests):
        t = tests[tid]
        n = len(t["seeds"])
        failed_any |= t["passed"] < n
        flag = "" if t["passed"] == n else "  <-- FAILS"
        print(f"{tid[-78:]:<78} {t['passed']:>4}/{n:<4} {statistics.fmean(t['seconds']):>7.2f}{flag}")
        for f in t["failures"][:3]:
            print(f"{'':>6}seed {f['seed']}: {f['message'][:150]}")
        if args.spread:
            for name, vals in t["measurements"].items():
                s = summary(vals)
                print(f"{'':>6}{name[:70]:<70} mean {s['mean']:.4g}  sd {s['sd']:.3g}  min {s['min']:.4g}  "
                      f"max {s['max']:.4g}  (n={s['n']})")
    n_fail = sum(len(t["failures"]) for t in tests.values())
    print(f"\n{len(tests)} tests x {len(seeds)} seeds in {wall:.0f} s: {n_fail} failed runs")

    result = {
        "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "seeds": seeds,
        "tests": {tid: {"proof": t["proof"], "test": t["test"], "fingerprint": t["fingerprint"],
                        "seeds": len(t["seeds"]), "passed": t["passed"], "failures": t["failures"],
                        "seconds": statistics.fmean(t["seconds"]),
                        "measurements": {k: summary(v) for k, v in t["measurements"].items()}}
                  for tid, t in tests.items()},
    }
    if args.json:
        args.json.write_text(json.dumps(result, indent=1, ensure_ascii=False), encoding="utf-8")
    if args.record:
        for proof in sorted({t["proof"] for t in result["tests"].values()}):
            path = report_path(proof)
            path.parent.mkdir(parents=True, exist_ok=True)
            old = json.loads(path.read_text(encoding="utf-8")) if path.exists() else {"proof": proof, "tests": {}}
            for t in result["tests"].values():
                if t["proof"] == proof:
                    old["tests"][t["test"]] = {**t, "date": result["date"], "seed_list": seeds}
            path.write_text(json.dumps(old, indent=1, ensure_ascii=False, sort_keys=True) + "\n", encoding="utf-8")
            print(f"recorded in {path.relative_to(E.ROOT)}")
    return 1 if failed_any else 0


if __name__ == "__main__":
    sys.exit(main())
