"""Which proof files need rerunning before the site can show them: `python -m proofs.stale`.

Prints, on stdout, the proof files with at least one test whose evidence is missing, failed, recorded under another
seed, or older than the code (fingerprint); on stderr, one line of counts. Reads the files' text and the evidence
only (no torch, no pytest), so `make serve` can skip the test run entirely when everything is current.
"""
from __future__ import annotations

import ast
import os
import sys
from pathlib import Path

from proofs import evidence as E


def test_names(proof: Path) -> list[str]:
    """Top-level `def test_...` functions of a proof file, without importing it."""
    tree = ast.parse(proof.read_text(encoding="utf-8"))
    return [n.name for n in tree.body if isinstance(n, ast.FunctionDef) and n.name.startswith("test_")]


def is_current(proof_rel: str, test_name: str, seed: int, fingerprint: str) -> bool:
    """True when this test's evidence passed, with this seed, against the code with this fingerprint."""
    doc = E.load(proof_rel, test_name)
    return (doc is not None and doc.get("outcome") == "passed" and doc["provenance"].get("seed") == seed
            and doc["provenance"].get("fingerprint") == fingerprint)


def stale_files(seed: int) -> tuple[list[str], int]:
    """(proof files with a test whose evidence is not current, number of tests whose evidence is current)."""
    stale, current = [], 0
    for proof in sorted((E.ROOT / "proofs").rglob("proof_*.py")):
        rel, print_, names = proof.relative_to(E.ROOT).as_posix(), E.fingerprint(proof), test_names(proof)
        fresh = sum(is_current(rel, name, seed, print_) for name in names)
        if fresh < len(names):
            stale.append(rel)
        current += fresh
    return stale, current


def main() -> None:
    seed = int(os.environ.get("PROOF_SEED", "0"))
    stale, current = stale_files(seed)
    print(" ".join(stale))
    print(f"proof evidence: {current} tests current (seed {seed}), {len(stale)} proof files to rerun", file=sys.stderr)


if __name__ == "__main__":
    main()
