"""Evidence: what a proof measured, written where the site build can read it.

A proof test takes the `ev` fixture and records named measurements and figures:

    ev.record("var_d64", 63.8, expect="about 64 (= d_k)")
    ev.figure(fig, "variance", caption="Var(q.k) against d_k")

After the test the pytest plugin writes `evidence/<proof path>/<test>.json` with
the measurements, the test's outcome, the claims it is marked with, and the
provenance (date, torch version, seed, run time, fingerprint of the code, the
command that reproduces it). The site build refuses evidence whose fingerprint
no longer matches the code, so a page never shows numbers of an older proof.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import json
import math
import re
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
EVIDENCE_DIR = Path(os.environ.get("PROOF_EVIDENCE_DIR", ROOT / "evidence"))
# What a proof's fingerprint covers: its own file, the project modules it imports (followed through their imports),
# and of the shared model package only the files that hold the names it imports and what those import in turn.
SHARED_FILES = ("evidence.py",)  # hashed for every proof: the plugin records all evidence through it
SHARED_PACKAGES = ("transformer",)  # packages resolved name by name through their __init__.py re-exports
VERDICTS = ("confirmed", "nuanced", "refuted")


def _module_file(module: str) -> Path | None:
    base = ROOT / "proofs" / module.replace(".", "/")
    return next((p for p in (base.with_suffix(".py"), base / "__init__.py") if p.is_file()), None)


@functools.lru_cache(maxsize=None)
def _imports(path: Path, stamp: tuple[int, int]) -> tuple[tuple, tuple]:
    """A file's (project imports, relative imports), parsed once per version of the file (stamp: mtime_ns, size).
    Project imports: (module under proofs., names) for every `from proofs.x import a, b` / `import proofs.x`;
    relative imports: the file names of its `from .x import ...` / `from . import x`. Lazy imports inside
    functions count too."""
    project, relative = [], []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("proofs."):
            project.append((node.module[len("proofs."):], tuple(a.name for a in node.names)))
        elif isinstance(node, ast.Import):
            project += [(a.name[len("proofs."):], ()) for a in node.names if a.name.startswith("proofs.")]
        elif isinstance(node, ast.ImportFrom) and node.level == 1:
            relative += [f"{node.module}.py"] if node.module else [f"{a.name}.py" for a in node.names]
    return tuple(project), tuple(relative)


def _imports_of(path: Path) -> tuple[tuple, tuple]:
    st = path.stat()
    return _imports(path, (st.st_mtime_ns, st.st_size))


@functools.lru_cache(maxsize=None)
def _exports(init: Path, stamp: tuple[int, int]) -> dict[str, str]:
    out = {}
    for node in ast.parse(init.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            for a in node.names:
                out[a.asname or a.name] = f"{node.module}.py" if node.module else f"{a.name}.py"
    return out


def _package_exports(package: Path) -> dict[str, str]:
    """name -> the package's file that defines it, read from the __init__.py's `from .x import name` lines."""
    st = (package / "__init__.py").stat()
    return _exports(package / "__init__.py", (st.st_mtime_ns, st.st_size))


def _package_closure(package: Path, files: set[str]) -> set[Path]:
    """The given files of a package and every file of it they import (relative imports, lazy ones included)."""
    todo, seen = list(files), set()
    while todo:
        name = todo.pop()
        if name in seen or not (package / name).is_file():
            continue
        seen.add(name)
        todo += _imports_of(package / name)[1]
    return {(package / n).resolve() for n in seen}


def imported_modules(proof_file: Path | str) -> list[Path]:
    """The project modules a proof file imports from (`from proofs.x import ...`), followed through the modules
    they import in turn: a proof's shared set-up (e.g. proofs/warmup_runs.py) is part of its code. From a shared
    package (the model) only the files that define the imported names count, with the files those import: a new
    module of the package that a proof never reaches does not change its fingerprint."""
    own = Path(proof_file).resolve()
    seen: set[Path] = set()
    todo = [own]
    while todo:
        found: set[Path] = set()
        for module, names in _imports_of(todo.pop())[0]:
            top, _, sub = module.partition(".")
            if top in SHARED_PACKAGES:
                pkg = ROOT / "proofs" / top
                if sub:
                    files = {f"{sub}.py"}
                else:
                    exports = _package_exports(pkg)
                    files = {exports[n] for n in names if n in exports} | {f"{n}.py" for n in names if n not in exports}
                found |= _package_closure(pkg, files)
            else:
                p = _module_file(module)
                if p is not None:
                    found.add(p.resolve())
        for p in sorted(found - seen - {own}):
            seen.add(p)
            if not any(p.is_relative_to(ROOT / "proofs" / pkg) for pkg in SHARED_PACKAGES):
                todo.append(p)
    return sorted(seen)


def fingerprint(proof_file: Path | str) -> str:
    """sha256 over the proof file, the project modules it reaches (imported_modules) and SHARED_FILES."""
    h = hashlib.sha256()
    own = Path(proof_file).resolve()
    paths = [own, *imported_modules(own)]
    paths += [p for p in (ROOT / "proofs" / name for name in SHARED_FILES) if p not in paths]
    for p in paths:
        h.update(p.relative_to(ROOT).as_posix().encode() if p.is_relative_to(ROOT) else p.name.encode())
        h.update(Path(p).read_bytes())
    return h.hexdigest()[:16]


def evidence_path(proof_rel: str, test_name: str) -> Path:
    """evidence/proofs/attention/proof_scale.py/test_x.json (one file per test: safe under xdist)."""
    return EVIDENCE_DIR / proof_rel / f"{test_name}.json"


def _jsonable(v: Any) -> Any:
    if hasattr(v, "item") and getattr(v, "ndim", 1) == 0:
        v = v.item()
    if isinstance(v, float):
        return v if math.isfinite(v) else str(v)
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    return v


def fmt(v: Any) -> str:
    """Compact human formatting used by the terminal summary and the site."""
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        if v == 0:
            return "0"
        a = abs(v)
        if a >= 1e5 or a < 1e-3:
            return f"{v:.2e}"
        if a >= 100:
            return f"{v:.1f}"
        return f"{v:.3g}" if a < 1 else f"{v:.3f}".rstrip("0").rstrip(".")
    if isinstance(v, list):
        return "[" + ", ".join(fmt(x) for x in v) + "]"
    return str(v)


@dataclass
class Measurement:
    name: str
    value: Any
    expect: str = ""  # what the claim predicts, in words ("about 64 = d_k", "> 0.9")
    note: str = ""  # how it was measured, if not obvious
    key: bool = True  # show in the terminal summary


@dataclass
class Evidence:
    """Collects one test's measurements and figures; the plugin writes it out."""

    proof_rel: str
    test_name: str
    seed: int
    measurements: list[Measurement] = field(default_factory=list)
    figures: list[dict] = field(default_factory=list)

    def record(self, name: str, value: Any, expect: str = "", note: str = "", key: bool = True) -> Any:
        self.measurements.append(Measurement(name, _jsonable(value), expect, note, key))
        return value

    def figure(self, fig, name: str, caption: str = "") -> Path:
        """Save a matplotlib figure as SVG next to the evidence JSON."""
        path = evidence_path(self.proof_rel, self.test_name).with_name(f"{self.test_name}.{name}.svg")
        path.parent.mkdir(parents=True, exist_ok=True)
        import matplotlib

        matplotlib.rcParams["svg.hashsalt"] = "proof"  # deterministic ids in the SVG
        fig.savefig(path, format="svg", bbox_inches="tight", metadata={"Date": None})
        import matplotlib.pyplot as plt

        plt.close(fig)
        self.figures.append({"name": name, "file": path.name, "caption": caption})
        return path

    def to_json(self) -> dict:
        return {
            "measurements": [m.__dict__ for m in self.measurements],
            "figures": self.figures,
        }


def load(proof_rel: str, test_name: str) -> dict | None:
    p = evidence_path(proof_rel, test_name)
    return json.loads(p.read_text()) if p.exists() else None


def load_all(proof_rel: str) -> dict[str, dict]:
    d = EVIDENCE_DIR / proof_rel
    if not d.is_dir():
        return {}
    return {p.stem: json.loads(p.read_text()) for p in sorted(d.glob("*.json"))}
