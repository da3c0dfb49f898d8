"""Carry seed records across a change that moves no number (a speed-up, a refactor, a figure's layout).

    python -m proofs.restamp --pair OLD0 NEW0 --pair OLD1 NEW1            # what would be re-stamped
    python -m proofs.restamp --pair OLD0 NEW0 --pair OLD1 NEW1 --write    # and do it

A seed record (bench/seeds/<area>/<proof>.json) holds the spread of a test's measurements over many seeds and the
fingerprint of the code it ran against; the seeds page marks it stale once the code changes. A change to a shared
module (proofs/evidence.py is in every fingerprint) would mark every record stale although no number moved, and a
fresh sweep of every proof at 40 seeds takes hours. This tool checks the claim "no number moved" instead of trusting
it: each --pair is two evidence folders of the same proofs at the same seed, written before (OLD) and after (NEW)
the change (PROOF_EVIDENCE_DIR=... pytest proofs/... --proof-seed S). A test's record takes the new fingerprint only
when

  - its record carries the OLD runs' fingerprint (the record was current before the change), and
  - in every pair, at --min-seeds different seeds at least, both runs passed, with the same seed and torch thread
    count, and every measurement (name and value) is identical, up to what LAPACK varies from run to run (floats
    equal in all but their last few binary places, or both below 1e-12).

Everything else is left alone and stays stale until it is re-swept. The counts are printed either way.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from proofs.seeds import report_path


def _runs(folder: Path) -> dict[tuple[str, str], dict]:
    """(proof file, test) -> evidence document, for every evidence JSON under `folder`."""
    out = {}
    for p in folder.rglob("*.json"):
        doc = json.loads(p.read_text(encoding="utf-8"))
        if "provenance" in doc and "proof" in doc:
            out[(doc["proof"], doc["test"])] = doc
    return out


def _same(old: dict, new: dict) -> str:
    """'' when the two runs agree number for number; otherwise why not."""
    po, pn = old["provenance"], new["provenance"]
    if old["outcome"] != "passed" or new["outcome"] != "passed":
        return f"outcomes {old['outcome']} / {new['outcome']}"
    if (po["seed"], po.get("threads")) != (pn["seed"], pn.get("threads")):
        return f"seed/threads {po['seed']}/{po.get('threads')} vs {pn['seed']}/{pn.get('threads')}"
    mo = [(m["name"], m["value"]) for m in old["measurements"]]
    mn = [(m["name"], m["value"]) for m in new["measurements"]]
    diff = next(((a, b) for a, b in zip(mo, mn) if a[0] != b[0] or not _equal(a[1], b[1])), None)
    if diff or len(mo) != len(mn):
        return f"measurements differ: {diff or (len(mo), len(mn))}"
    return ""


ROUNDING_FLOOR = 1e-12  # two floats below this in size are an identity's rounding residue: equal, whatever their digits
LAST_PLACES = 1e-15  # two floats this close, relative to the larger, differ in their last few binary places only


def _equal(a, b) -> bool:
    """Identical values, element by element, except for what LAPACK varies from run to run with the same code and seed:
    floats that agree to within a few units in the last place (LAST_PLACES), or that are both rounding residue
    (ROUNDING_FLOOR). Peft's prompt-tuning test fits a least-squares residual that read [4.56e-16, 0.7393622177429917]
    in one run and [4.73e-16, 0.7393622177429918] in the next; such a record could never be carried across a change."""
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and isinstance(b, float):
        if abs(a) < ROUNDING_FLOOR and abs(b) < ROUNDING_FLOOR:
            return True
        return abs(a - b) <= LAST_PLACES * max(abs(a), abs(b))
    return a == b


def verify(pairs: list[tuple[Path, Path]], min_seeds: int) -> tuple[dict, dict]:
    """(proof, test) -> (old fingerprint, new fingerprint) for the tests that pass the check; and the others -> why."""
    ok: dict[tuple[str, str], tuple[str, str]] = {}
    why: dict[tuple[str, str], str] = {}
    seeds: dict[tuple[str, str], set[int]] = {}
    for old_dir, new_dir in pairs:
        old, new = _runs(old_dir), _runs(new_dir)
        for key in old.keys() | new.keys():
            if key in why:
                continue
            if key not in old or key not in new:
                why[key] = f"only in {'old' if key in old else 'new'} {old_dir if key in old else new_dir}"
                continue
            problem = _same(old[key], new[key])
            prints = (old[key]["provenance"]["fingerprint"], new[key]["provenance"]["fingerprint"])
            if not problem and ok.get(key, prints) != prints:
                problem = "the pairs disagree on the fingerprints"
            if problem:
                why[key] = problem
                ok.pop(key, None)
            else:
                ok[key] = prints
                seeds.setdefault(key, set()).add(old[key]["provenance"]["seed"])
    for key in list(ok):
        if len(seeds[key]) < min_seeds:
            why[key] = f"checked at {len(seeds[key])} seed(s), fewer than {min_seeds}"
            del ok[key]
    return ok, why


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pair", nargs=2, type=Path, action="append", required=True, metavar=("OLD", "NEW"),
                    help="evidence folders of the same proofs at one seed, before and after the change")
    ap.add_argument("--min-seeds", type=int, default=2, help="different seeds every test must be checked at")
    ap.add_argument("--write", action="store_true", help="write the new fingerprints into bench/seeds/")
    args = ap.parse_args(argv)
    ok, why = verify(args.pair, args.min_seeds)
    stamped = unchanged = not_current = 0
    for proof in sorted({p for p, _ in ok}):
        path = report_path(proof)
        if not path.exists():
            continue
        record = json.loads(path.read_text(encoding="utf-8"))
        changed = False
        for test, entry in record["tests"].items():
            prints = ok.get((proof, test))
            if prints is None:
                continue
            if entry["fingerprint"] == prints[1]:
                unchanged += 1
            elif entry["fingerprint"] == prints[0]:
                entry["fingerprint"], changed = prints[1], True
                stamped += 1
            else:
                not_current += 1  # stale before the change already: a re-sweep, not a re-stamp
        if changed and args.write:
            path.write_text(json.dumps(record, indent=1, ensure_ascii=False, sort_keys=True) + "\n", encoding="utf-8")
    for (proof, test), reason in sorted(why.items()):
        print(f"not identical: {proof}::{test}: {reason}")
    print(f"{len(ok)} tests identical at >= {args.min_seeds} seeds; records {'re-stamped' if args.write else 'to re-stamp'}:"
          f" {stamped}, already current: {unchanged}, stale before the change (left alone): {not_current};"
          f" tests that differ or were not checked: {len(why)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
