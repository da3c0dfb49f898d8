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


def test_project_modules_are_imported_in_a_form_the_fingerprint_follows():
    """A proof's evidence is current only while the code it ran is unchanged: proofs/evidence.py hashes the project
    modules a proof imports as `from proofs.x import a` or `import proofs.x`. `from proofs import x` names the
    module as an attribute of the package, which that reading does not follow, so an edit to x would leave the
    evidence marked current (two proofs did this: kv_eviction and hybrids)."""
    offenders = []
    modules = {p.stem for p in (ROOT / "proofs").glob("*.py")} | {p.name for p in (ROOT / "proofs").iterdir() if p.is_dir()}
    for path in sorted((ROOT / "proofs").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module == "proofs":
                offenders += [f"{path.relative_to(ROOT)}:{node.lineno} from proofs import {a.name}" for a in node.names
                              if a.name in modules and a.name != "evidence"]
    assert not offenders, "write `import proofs.x as X` or `from proofs.x import ...`:\n" + "\n".join(offenders)
