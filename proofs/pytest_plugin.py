"""pytest plugin for proofs: the claim marker, the seed, evidence files and the claims summary.

    @pytest.mark.claim("C-SCALE-1", "confirmed")
    def test_variance_grows_with_dk(ev, seed): ...

- `--proof-seed N` (or PROOF_SEED=N) reruns every proof with another seed.
- The `ev` fixture records measurements; after the test its evidence JSON is written.
- The terminal summary lists every claim the run settled, its outcome and key numbers.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import re
from functools import lru_cache
from pathlib import Path

import pytest
import yaml

from proofs import evidence as E

CLAIM_ID = re.compile(r"^C-[A-Z]+-\d+$")


@lru_cache(maxsize=1)
def registry() -> dict[str, dict]:
    return yaml.safe_load((E.ROOT / "proofs" / "claims.yml").read_text(encoding="utf-8"))


def pytest_addoption(parser):
    parser.addoption(
        "--reuse-evidence",
        action="store_true",
        help="skip proofs whose evidence is current: passed, same seed, same code fingerprint (make serve uses it)",
    )
    parser.addoption(
        "--proof-seed",
        type=int,
        default=int(os.environ.get("PROOF_SEED", "0")),
        help="base seed for every proof (default: $PROOF_SEED or 0)",
    )


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "claim(id, verdict): the proof settles claim `id` (see proofs/claims.yml) with `verdict`"
    )
    threads = os.environ.get("PROOF_THREADS") or ("1" if os.environ.get("PYTEST_XDIST_WORKER") else None)
    if threads:
        import torch

        torch.set_num_threads(int(threads))  # one thread per xdist worker: 2 workers x 2 threads run 3x slower


def _claims_of(item) -> list[tuple[str, str]]:
    out = []
    for m in item.iter_markers("claim"):
        if len(m.args) != 2:
            raise pytest.UsageError(f"{item.nodeid}: use @pytest.mark.claim('C-…', 'confirmed|nuanced|refuted')")
        cid, verdict = m.args
        if not CLAIM_ID.match(cid) or cid not in registry():
            raise pytest.UsageError(f"{item.nodeid}: claim id {cid!r} is not in proofs/claims.yml")
        if verdict not in E.VERDICTS:
            raise pytest.UsageError(f"{item.nodeid}: verdict {verdict!r} must be one of {E.VERDICTS}")
        out.append((cid, verdict))
    return out


def _is_current(item, seed: int, prints: dict) -> bool:
    """True when this test's evidence passed, with this seed, against the current code."""
    proof_rel = _proof_rel(item)
    doc = E.load(proof_rel, item.name)
    if doc is None or doc.get("outcome") != "passed" or doc["provenance"].get("seed") != seed:
        return False
    if proof_rel not in prints:
        prints[proof_rel] = E.fingerprint(E.ROOT / proof_rel)
    return doc["provenance"]["fingerprint"] == prints[proof_rel]


def pytest_collection_modifyitems(config, items):
    for item in items:
        _claims_of(item)  # fail early on a bad marker
    if config.getoption("--reuse-evidence"):
        seed, prints = config.getoption("--proof-seed"), {}
        reused = [it for it in items if "proofs" in Path(str(it.fspath)).parts and _is_current(it, seed, prints)]
        if reused:
            config.hook.pytest_deselected(items=reused)
            items[:] = [it for it in items if it not in reused]
        config._proof_reused = len(reused)


@pytest.fixture
def seed(request) -> int:
    """The base seed of this run; statistical proofs use seed, seed+1, ... and report the spread."""
    return request.config.getoption("--proof-seed")


@pytest.fixture(autouse=True)
def _seed_everything(request):
    if "proofs" in Path(str(request.node.fspath)).parts:
        import numpy as np
        import torch

        s = request.config.getoption("--proof-seed")
        torch.manual_seed(s)
        np.random.seed(s)
    yield


def _proof_rel(item) -> str:
    return Path(str(item.fspath)).resolve().relative_to(E.ROOT).as_posix()


@pytest.fixture
def ev(request, seed) -> E.Evidence:
    return E.Evidence(proof_rel=_proof_rel(request.node), test_name=request.node.name, seed=seed)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.when != "call":
        return
    claims = _claims_of(item)
    ev = item.funcargs.get("ev") if hasattr(item, "funcargs") else None
    key = [(m.name, E.fmt(m.value)) for m in ev.measurements if m.key] if ev else []
    report.user_properties.append(("claims", claims))
    report.user_properties.append(("key_numbers", key))
    if ev is None:
        return
    import torch

    proof_rel = _proof_rel(item)
    seed = ev.seed
    seed_flag = "" if seed == 0 else f" --proof-seed {seed}"
    doc = {
        "proof": proof_rel,
        "test": item.name,
        "doc": (item.function.__doc__ or "").strip() if hasattr(item, "function") else "",
        "claims": [{"id": c, "verdict": v} for c, v in claims],
        "outcome": report.outcome,
        "failure": str(report.longrepr.reprcrash.message) if report.failed and hasattr(report.longrepr, "reprcrash") else "",
        **ev.to_json(),
        "provenance": {
            "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "torch": torch.__version__,
            "python": platform.python_version(),
            "threads": torch.get_num_threads(),
            "seed": seed,
            "seconds": round(report.duration, 2),
            "fingerprint": E.fingerprint(item.fspath),
            "command": f"pytest '{proof_rel}::{item.name}'{seed_flag}",
        },
    }
    path = E.evidence_path(proof_rel, item.name)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1, ensure_ascii=False), encoding="utf-8")


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    rows = []
    for status in ("passed", "failed"):
        for rep in terminalreporter.stats.get(status, []):
            if getattr(rep, "when", "") != "call":
                continue
            props = dict(rep.user_properties)
            for cid, verdict in props.get("claims", []):
                rows.append((cid, verdict, rep.outcome, rep.nodeid.split("::")[-1], props.get("key_numbers", [])))
    reused = getattr(config, "_proof_reused", 0)
    if reused:
        terminalreporter.write_line(f"{reused} proof tests reused their current evidence (--reuse-evidence); "
                                    f"`make proofs` reruns them all.")
    if not rows:
        return
    tr = terminalreporter
    tr.write_sep("=", "claims settled by this run")
    for cid, verdict, outcome, test, key in sorted(rows):
        mark = "PASS" if outcome == "passed" else "FAIL"
        tr.write_line(f"{cid:<11} {verdict:<9} {mark}  {test}")
        nums = "; ".join(f"{k} = {v}" for k, v in key[:6])
        if nums:
            tr.write_line(f"{'':<11} {nums}")
    seed = config.getoption("--proof-seed")
    tr.write_line(f"(seed {seed}; evidence written to {E.EVIDENCE_DIR.relative_to(E.ROOT) if E.EVIDENCE_DIR.is_relative_to(E.ROOT) else E.EVIDENCE_DIR})")
