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

CLAIM_ID = re.compile(r"^C-[A-Z][A-Z0-9]*-\d+$")  # C-T5-1: a digit may follow the first letter


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
        "--progress",
        action="store_true",
        help="one line per finished proof: its outcome, how many are left, what is running, the time left",
    )
    parser.addoption(
        "--proof-seed",
        type=int,
        default=int(os.environ.get("PROOF_SEED", "0")),
        help="base seed for every proof (default: $PROOF_SEED or 0)",
    )


def pytest_configure(config):
    if config.getoption("--progress") and not os.environ.get("PYTEST_XDIST_WORKER"):
        config.pluginmanager.register(Progress(config), "proof-progress")
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
    from proofs.stale import is_current

    proof_rel = _proof_rel(item)
    if proof_rel not in prints:
        prints[proof_rel] = E.fingerprint(E.ROOT / proof_rel)
    return is_current(proof_rel, item.name, seed, prints[proof_rel])


def _prune_orphan_evidence(items) -> None:
    """Delete evidence (json and figures) of tests their proof file no longer defines: a renamed or deleted test
    must not leave numbers behind that look current."""
    modules = {}
    for it in items:
        if "proofs" in Path(str(it.fspath)).parts and getattr(it, "module", None) is not None:
            modules[_proof_rel(it)] = it.module
    for proof_rel, module in modules.items():
        defined = {n for n in vars(module) if n.startswith("test_")}
        folder = E.EVIDENCE_DIR / proof_rel
        if not folder.is_dir():
            continue
        for f in folder.iterdir():
            if f.name.split(".")[0].split("[")[0] not in defined:
                f.unlink(missing_ok=True)


# Shared set-ups that cache their trained arms (functools.cache) for several proof files. Under pytest-xdist's
# --dist loadfile each file is a unit of work, so two files on two workers trained the same arm twice; the files that
# import one of these run as one unit instead (pytest_xdist_make_scheduler), and each arm trains once per run.
CACHED_SETUPS = ("length_runs.py", "block_lm.py")


_FROM_PROOFS = re.compile(r"^from proofs\.(\w+) import", re.M)  # the form test_proof_independence requires


@lru_cache(maxsize=None)
def _reaches(module: str) -> str | None:
    """The cached set-up that proofs/<module>.py is or imports (through other project modules), else None."""
    if f"{module}.py" in CACHED_SETUPS:
        return f"proofs/{module}.py"
    path = E.ROOT / "proofs" / f"{module}.py"  # a package (the model) is not a file here: it reaches no set-up
    names = _FROM_PROOFS.findall(path.read_text(encoding="utf-8")) if path.is_file() else []
    return next((u for u in map(_reaches, names) if u), None)


def work_unit(file: str) -> str:
    """The unit of work of a proof file under --dist loadfile: the cached set-up it imports, else the file itself.
    A regex over import lines, not evidence.imported_modules (1.5 s): the scheduler asks before any test runs."""
    path = E.ROOT / file
    if not (path.name.startswith("proof_") and path.is_file()):
        return file
    return next((u for u in map(_reaches, _FROM_PROOFS.findall(path.read_text(encoding="utf-8"))) if u), file)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class SharedSetupScheduling(LoadFileScheduling):
        """--dist loadfile, except that the proof files sharing a cached set-up go to one worker together."""

        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid.split("::", 1)[0])

    return SharedSetupScheduling(config, log)


def pytest_collection_modifyitems(config, items):
    for item in items:
        _claims_of(item)  # fail early on a bad marker
    _prune_orphan_evidence(items)
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
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")  # write, then rename: a build reading now sees old or new
    tmp.write_text(json.dumps(doc, indent=1, ensure_ascii=False), encoding="utf-8")
    os.replace(tmp, path)


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


class Progress:
    """--progress: the terminal says which proofs run, how many are left and about how long that takes.

    The estimate of each proof's time is its run time in its last evidence (else the median of the others),
    divided among the workers; at the end a summary counts passed, failed and reused proofs and names the
    slowest files.
    """

    def __init__(self, config):
        import time

        self.config, self.time = config, time
        self.expected: dict[str, float] = {}
        self.running: dict[str, float] = {}
        self.done: list[tuple[str, str, float]] = []  # (nodeid, outcome, seconds)
        self.done_ids: set[str] = set()  # the nodeids in done, for the per-report look-ups
        self.workers = max(1, int(getattr(config.option, "numprocesses", 0) or 1))
        self.start = time.perf_counter()

    @staticmethod
    def _expect(nodeid: str) -> float:
        path, _, name = nodeid.partition("::")
        doc = E.load(path, name) if path.startswith("proofs/") else None
        return float(doc["provenance"]["seconds"]) if doc else float("nan")

    def _plan(self, nodeids) -> None:
        import math
        import statistics

        known = {k: self._expect(k) for k in nodeids}
        seen = [v for v in known.values() if not math.isnan(v)]
        default = statistics.median(seen) if seen else 1.0
        self.expected = {k: (default if math.isnan(v) else v) for k, v in known.items()}

    def pytest_collection_finish(self, session):
        if session.items:  # without xdist; with it the workers report their collections below
            self._plan([it.nodeid for it in session.items])

    def pytest_xdist_node_collection_finished(self, node, ids):
        if not self.expected:
            self._plan(ids)

    @pytest.hookimpl(tryfirst=True)
    def pytest_report_teststatus(self, report, config):
        if report.when == "call" or (report.when == "setup" and not report.passed):
            return report.outcome, "", report.outcome.upper()  # no progress dot: our line says it

    def pytest_runtest_logstart(self, nodeid, location):
        self.running[nodeid] = self.time.perf_counter()

    def pytest_runtest_logreport(self, report):
        finished = report.when == "call" or (report.when == "setup" and not report.passed)
        if not finished or report.nodeid in self.done_ids:
            return
        self.running.pop(report.nodeid, None)
        self.done.append((report.nodeid, report.outcome, report.duration))
        self.done_ids.add(report.nodeid)
        left = [k for k in self.expected if k not in self.done_ids]
        eta = sum(self.expected[k] for k in left) / self.workers
        now = [k.split("::")[-1] for k in self.running][:2]
        tr = self.config.pluginmanager.get_plugin("terminalreporter")
        tr.ensure_newline()
        mark = {"passed": "ok  ", "failed": "FAIL", "skipped": "skip"}[report.outcome]
        tr.write_line(f"[{len(self.done):>3}/{len(self.expected)}] {mark} {report.nodeid}  {report.duration:.1f} s"
                      f"  | {len(left)} left, about {int(eta // 60)}:{int(eta % 60):02d}"
                      + (f" | running {', '.join(now)}" if now else ""))

    def pytest_terminal_summary(self, terminalreporter):
        tr = terminalreporter
        counts = {o: sum(1 for d in self.done if d[1] == o) for o in ("passed", "failed", "skipped")}
        reused = getattr(self.config, "_proof_reused", 0)
        if self.config.getoption("--reuse-evidence") and not reused:  # under xdist the workers deselected them
            from proofs.stale import test_names

            files = []
            for arg in self.config.args:
                path = Path(self.config.invocation_params.dir, arg.split("::")[0])
                files += [path] if path.is_file() else sorted(path.rglob("proof_*.py"))
            total = sum(len(test_names(f)) for f in files if f.name.startswith("proof_"))
            reused = max(0, total - len(self.done))
        per_file: dict[str, float] = {}
        for nodeid, _, sec in self.done:
            per_file[nodeid.split("::")[0]] = per_file.get(nodeid.split("::")[0], 0.0) + sec
        tr.write_sep("-", "proof run summary")
        tr.write_line(f"{counts['passed']} passed, {counts['failed']} failed, {counts['skipped']} skipped, {reused} reused "
                      f"in {self.time.perf_counter() - self.start:.0f} s wall")
        for f, sec in sorted(per_file.items(), key=lambda kv: -kv[1])[:5]:
            tr.write_line(f"  slowest: {f}  {sec:.1f} s")
