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
# Files every proof depends on besides its own: a change to any of them makes all evidence stale.
SHARED_FILES = ("tasks.py", "train.py", "evidence.py", "measure.py", "distributed.py")
SHARED_PACKAGES = ("transformer",)  # every file of proofs/transformer/
VERDICTS = ("confirmed", "nuanced", "refuted")


IMPORTED = re.compile(r"^\s*from proofs\.([\w.]+) import", re.M)


def _module_file(module: str) -> Path | None:
    base = ROOT / "proofs" / module.replace(".", "/")
    return next((p for p in (base.with_suffix(".py"), base / "__init__.py") if p.is_file()), None)


def imported_modules(proof_file: Path | str) -> list[Path]:
    """The project modules a proof file imports from (`from proofs.x import ...`), followed through the modules
    they import in turn: a proof's shared set-up (e.g. proofs/warmup_runs.py) is part of its code."""
    seen: set[Path] = set()
    todo = [Path(proof_file).resolve()]
    while todo:
        for m in IMPORTED.findall(todo.pop().read_text(encoding="utf-8")):
            p = _module_file(m)
            if p is not None and p.resolve() not in seen and p.resolve() != Path(proof_file).resolve():
                seen.add(p.resolve())
                todo.append(p.resolve())
    return sorted(seen)


def fingerprint(proof_file: Path | str) -> str:
    """sha256 over the proof file, the project modules it imports from, and the shared library."""
    h = hashlib.sha256()
    own = Path(proof_file)
    paths = [own, *imported_modules(own)] + [ROOT / "proofs" / name for name in SHARED_FILES]
    paths += sorted(p for pkg in SHARED_PACKAGES for p in (ROOT / "proofs" / pkg).glob("*.py"))
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
