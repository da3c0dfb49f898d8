"""Reading the at-scale records (bench/at_scale/*.json, written by `python -m proofs.at_scale`): no torch needed.

    COMPARISONS    which arms each page's "At scale" box sets against which, on which measurements, and the
                   direction the page's toy verdict predicts for each
    compare()      one comparison read from a record: means ± sd, differences, their standard errors and z
    records()      the committed records, the full one of a preset and a longer partial run if there is one

A difference's standard error comes from the baseline arm's spread over its seeds (the run's own noise); it
counts once it is Z_RESOLVED standard errors from zero. The reading is mechanical: "holds" (the toy's direction,
resolved), "flips" (the other direction, resolved), "within noise", or for a toy that predicts no difference
"holds" / "differs".
"""

from __future__ import annotations

import ast
import hashlib
import json
import math
import statistics
from dataclasses import dataclass
from pathlib import Path

from proofs.evidence import _package_closure

ROOT = Path(__file__).resolve().parents[1]
RECORDS = ROOT / "bench" / "at_scale"  # committed records: <preset>.json, and <preset>-longer.json (partial)
CACHE = ROOT / "build" / "at_scale"  # the corpus and the runs in progress (never committed)
TRAINING_CODE = ("arms", "base_config", "stdlib_files", "build_corpus", "lr_at", "windows", "score", "attention_stats",
                 "train_run")  # the functions of proofs/at_scale.py that decide what a run computes
REQUIRED = ("preset", "device", "torch", "corpus", "steps", "runs", "summary", "training_fingerprint", "date")


MODEL_ROOTS = ("models.py", "attention.py")  # the shared-model files proofs/at_scale.py builds its runs from


def model_files(package: Path = ROOT / "proofs" / "transformer") -> list[Path]:
    """The files of the shared model a run computes with: MODEL_ROOTS and every module of the package they import,
    directly or through one another (relative imports, lazy ones inside functions included). The package's other
    files (LoRA, quantisation, decoding helpers, adapters and mixers the runs never build) are left out, so adding
    one does not make a record stale."""
    return sorted(_package_closure(package, set(MODEL_ROOTS)))  # the same walk that evidence fingerprints use


def training_fingerprint(runner: Path = ROOT / "proofs" / "at_scale.py",
                         package: Path = ROOT / "proofs" / "transformer") -> str:
    """sha256 (16 hex) of the code that decides what a run computes: TRAINING_CODE's source (read from the file,
    decorators included) and the shared model's files that the runs import (model_files). Scheduling and timing
    are left out, so a faster runner does not make a record stale; a change to any of these does. (Records before
    2026-11-27 hashed every file of the package.)"""
    text = runner.read_text(encoding="utf-8")
    lines = text.splitlines(keepends=True)
    defs = {n.name: n for n in ast.parse(text).body if isinstance(n, ast.FunctionDef)}
    h = hashlib.sha256()
    for name in TRAINING_CODE:
        node = defs[name]
        first = min([node.lineno] + [d.lineno for d in node.decorator_list])
        h.update("".join(lines[first - 1:node.end_lineno]).encode())
    for f in model_files(package):
        h.update(f.name.encode() + f.read_bytes())
    return h.hexdigest()[:16]


@dataclass(frozen=True)
class Comparison:
    page: str  # docs-relative page that shows the box
    base: str  # the arm the switches are read against
    base_label: str  # what the base arm is, in this question's terms
    switches: tuple[str, ...]  # arms compared with it
    metrics: tuple[tuple[str, str, object], ...]  # (summary key, label, the toy's direction of switch - base:
    #                                              -1 lower, +1 higher, 0 no difference, None no single direction;
    #                                              or a dict switch -> direction where the switches differ)


LOSS = "held-out loss (nats/byte)"
COMPARISONS = {
    "sqrt_dk": Comparison("attention/why-scale-sqrt-dk.md", "base", "q·k / √d_k", ("no_scale",), (
        ("val", LOSS, +1), ("attn_entropy_init", "attention entropy at init (nats)", -1),
        ("attn_entropy", "attention entropy after training (nats)", -1),
        ("largest_logit_init", "largest logit at init", +1), ("largest_logit", "largest logit after training", +1))),
    "post_ln": Comparison("normalisation/pre-ln-vs-post-ln.md", "pre_hi_lr", "Pre-LN", ("post_hi_lr",), (
        ("val", LOSS, +1), ("train_eval", "training loss (nats/byte)", +1), ("accuracy", "next-byte accuracy", -1))),
    "swiglu": Comparison("blocks/swiglu.md", "base", "ReLU, 4d", ("swiglu",), (("val", LOSS, -1),)),
    "rmsnorm": Comparison("blocks/rmsnorm.md", "base", "LayerNorm", ("rmsnorm", "ln_no_bias"), (("val", LOSS, 0),)),
    "tying": Comparison("positions/weight-tying.md", "base", "tied", ("untied",), (
        ("val", LOSS, +1), ("gap", "held-out minus training loss", +1))),
    "parallel": Comparison("blocks/parallel-block.md", "base", "sequential", ("parallel",), (("val", LOSS, 0),)),
    "gqa": Comparison("inference/gqa-kv-cache.md", "base", "MHA", ("gqa", "mqa"), (("val", LOSS, 0),)),
    "positions": Comparison("relative/extrapolation.md", "base", "sinusoidal", ("rope", "alibi"), (
        # the toy: ALiBi holds past the training length, RoPE falls to the sinusoids' level at 4x (no order at 2x)
        ("val_4x_beyond", "loss past the training length, at 4x", {"rope": 0, "alibi": -1}),  # first: the verdict's
        ("val_2x_beyond", "loss past the training length, at 2x", {"rope": None, "alibi": -1}),
        ("rise_4x", "rise past 4x over its own loss at the training length", {"rope": 0, "alibi": -1}),
        ("val", LOSS + " at the training length", None))),
    "label_smoothing": Comparison("training/label-smoothing.md", "base", "ε = 0", ("label_smoothing",), (
        ("val", LOSS, +1), ("confidence", "mean top-1 confidence", -1), ("accuracy", "next-byte accuracy", +1),
        ("ece", "calibration error (ECE, 15 bins)", None))),  # the page: better on noisy labels, worse on clean ones
    "dropout": Comparison("training/dropout.md", "base", "no dropout", ("dropout",), (
        ("val", LOSS, -1), ("gap", "held-out minus training loss", -1))),
}
ARM_LABELS = {"no_scale": "q·k unscaled", "swiglu": "SwiGLU, 8/3·d", "rmsnorm": "RMSNorm", "ln_no_bias": "LayerNorm, bias 0",
              "untied": "untied", "parallel": "parallel", "gqa": "GQA", "mqa": "MQA", "rope": "RoPE", "alibi": "ALiBi",
              "label_smoothing": "ε = 0.1", "dropout": "dropout 0.1", "post_hi_lr": "Post-LN", "pre_hi_lr": "Pre-LN",
              "base": "baseline"}
Z_RESOLVED = 3.0  # a difference counts once it is this many standard errors from zero


def metric(summary: dict, arm: str, key: str) -> dict | None:
    """mean, sd, n of one measurement of one arm; 'gap' is held-out minus training loss and 'rise_4x' the loss past
    4x the training length minus the loss at it, per seed."""
    s = summary.get(arm)
    if s is None:
        return None
    derived = {"gap": ("val", "train_eval"), "rise_4x": ("val_4x_beyond", "val")}  # per seed: first minus second
    if key in derived:
        a, b = derived[key]
        if a not in s or b not in s:
            return None
        vals = [x - y for x, y in zip(s[a]["values"], s[b]["values"])]
    elif key in s:
        vals = s[key]["values"]
    else:
        return None
    return {"mean": statistics.fmean(vals), "sd": statistics.stdev(vals) if len(vals) > 1 else 0.0, "n": len(vals)}


def outcome(diff: float, se: float, expect) -> tuple[float, str]:
    """z = diff / se and the reading: holds / within noise / flips (a toy direction), holds / differs (toy: no
    difference), lower / higher / within noise (no single toy direction)."""
    z = diff / se if se > 0 else math.copysign(math.inf, diff) if diff else 0.0
    if expect == 0:
        return z, "holds" if abs(z) < Z_RESOLVED else "differs"
    if abs(z) < Z_RESOLVED:
        return z, "within noise"
    if expect is None:
        return z, "lower" if z < 0 else "higher"
    return z, "holds" if z * expect > 0 else "flips"


def compare(record: dict, name: str, longer: dict | None = None) -> dict:
    """One comparison read from a record: every arm's mean ± sd per metric, and per switch and metric the
    difference from the base arm, its standard error (from the baseline arm's seed spread, the run's noise), z
    and the reading. `longer`, a record of a longer run (held-out loss only), adds the difference there."""
    c = COMPARISONS[name]
    s = record["summary"]
    rows = []
    for key, label, expect in c.metrics:
        noise = metric(s, "base", key)
        b = metric(s, c.base, key)
        if b is None or noise is None:
            continue
        row = {"metric": key, "label": label, "arms": {c.base: b}, "diffs": {}}
        for sw in c.switches:
            m = metric(s, sw, key)
            if m is None:
                continue
            row["arms"][sw] = m
            exp = expect.get(sw) if isinstance(expect, dict) else expect  # the toy's direction for this switch
            diff = m["mean"] - b["mean"]
            se = noise["sd"] * math.sqrt(1 / b["n"] + 1 / m["n"])
            z, reading = outcome(diff, se, exp)
            d = {"diff": diff, "se": se, "z": z, "reading": reading, "expect": exp}
            if longer and key in ("val",):
                lb, lm, ln = (metric(longer["summary"], a, key) for a in (c.base, sw, "base"))
                if lb and lm and ln:
                    d2 = lm["mean"] - lb["mean"]
                    se2 = ln["sd"] * math.sqrt(1 / lb["n"] + 1 / lm["n"])
                    z2, reading2 = outcome(d2, se2, exp)
                    resolved = abs(z) >= Z_RESOLVED and abs(z2) >= Z_RESOLVED
                    d["longer"] = {"steps": longer["steps"], "diff": d2, "se": se2, "z": z2, "reading": reading2,
                                   "trend": trend(diff, d2) if resolved else None}
            row["diffs"][sw] = d
        rows.append(row)
    return {"name": name, "page": c.page, "base": c.base, "base_label": c.base_label, "switches": list(c.switches), "rows": rows,
            "steps": record["steps"], "preset": record["preset"]["name"]}


def trend(d1: float, d2: float) -> str:
    """How a difference moved from the shorter run to the longer one."""
    if d1 * d2 < 0:
        return "changes sign"
    r = abs(d2) / abs(d1) if d1 else math.inf
    return "shrinks" if r < 2 / 3 else "grows" if r > 3 / 2 else "stays about the same"


def records(root: Path = RECORDS) -> tuple[dict | None, dict | None]:
    """The record to show (gpu before cpu) and, if committed, a longer partial run of the same preset."""
    for preset in ("gpu", "cpu"):
        f = root / f"{preset}.json"
        if f.is_file():
            longer = root / f"{preset}-longer.json"
            return json.loads(f.read_text()), (json.loads(longer.read_text()) if longer.is_file() else None)
    return None, None


def check_record(r: dict) -> list[str]:
    """What a record lacks: the fields the boxes and the note rely on, one summary entry per arm run."""
    problems = [f"missing field {k!r}" for k in REQUIRED if k not in r]
    for run in r.get("runs", []):
        if "error" in run:
            problems.append(f"run {run.get('arm')} seed {run.get('seed')} failed: {run['error']}")
    for arm in {run["arm"] for run in r.get("runs", []) if "error" not in run}:
        if arm not in r.get("summary", {}):
            problems.append(f"arm {arm} has runs but no summary")
    return problems


def verdict(c: dict) -> list[tuple[str, str, str]]:
    """Per switch, from the comparison's first (primary) measurement: (switch, reading, one sentence). The sentence
    says whether the toy's direction holds, flips or stays inside the noise, at the record's steps and, if there is
    one, the longer run's, and whether the difference shrinks or grows with training."""
    row = c["rows"][0]
    out = []
    for sw, d in row["diffs"].items():
        name = ARM_LABELS.get(sw, sw)
        base = c["base_label"]
        what = f"{name} − {base}: {d['diff']:+.3f} ({z_text(d['z'])}) at {c['steps']} steps"
        longer = d.get("longer")
        if longer:
            what += f", {longer['diff']:+.3f} ({z_text(longer['z'])}) at {longer['steps']}"
        readings = [d["reading"]] + ([longer["reading"]] if longer else [])
        if d["expect"] == 0:
            if all(r == "holds" for r in readings):
                say, key = "Holds at scale: no difference beyond the run's noise", "holds"
            elif readings[-1] == "holds":
                say, key = "Holds at scale once trained longer: no difference beyond the noise there", "holds"
            else:
                say, key = f"Differs at scale: {name} is {'higher' if d['diff'] > 0 else 'lower'}, beyond the noise", "differs"
        elif d["expect"] is None:
            say, key = f"At scale {name} is {'lower' if d['diff'] < 0 else 'higher'}" + (
                "" if abs(d["z"]) >= Z_RESOLVED else ", within the noise"), readings[0]
        elif "flips" in readings:
            say, key = "Flips at scale: the difference goes the other way, beyond the noise", "flips"
        elif all(r == "holds" for r in readings):
            say, key = "Holds at scale", "holds"
        elif readings[-1] == "holds":
            say, key = "Holds at scale once trained longer (within the noise at the shorter run)", "holds"
        elif readings[0] == "holds":
            say, key = "Holds at the shorter run; within the noise at the longer one", "within noise"
        else:
            say, key = "Not resolved at scale: within the noise", "within noise"
        if longer and longer.get("trend") in ("shrinks", "grows"):
            say += f"; the difference {longer['trend']} with longer training"
        out.append((sw, key, f"{say} ({what}; held-out loss, nats/byte)."))
    return out


def z_text(z: float) -> str:
    """|z| in words, capped: beyond 10 standard errors the exact figure says nothing more."""
    return "over 10 standard errors" if abs(z) > 10 else f"{abs(z):.1f} standard errors"
