"""A proof reads on its own: no proof file imports another proof file. Set-ups that several proofs share live in
named modules beside proofs/tasks.py and proofs/train.py (e.g. proofs/block_lm.py, proofs/length_runs.py)."""

from __future__ import annotations

import ast

from tests.pages import ROOT


def test_no_proof_imports_another_proof():
    offenders = []
    for path in sorted((ROOT / "proofs").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = ([node.module or ""] if isinstance(node, ast.ImportFrom)
                     else [a.name for a in node.names] if isinstance(node, ast.Import) else [])
            offenders += [f"{path.relative_to(ROOT)}:{node.lineno} imports {n}" for n in names
                          if any(part.startswith("proof_") for part in n.split("."))]
    assert not offenders, "move the shared set-up into a module beside proofs/tasks.py:\n" + "\n".join(offenders)
