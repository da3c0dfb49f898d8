"""Coding drills: each is a real exercise (blank, it fails with NotImplementedError), its checks pass with the
shared model's own code in place of the reader's (DRILLS=reference), and it names a question page that links it."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from tests.pages import ROOT, question_pages

DRILLS = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "proofs" / "drills").glob("drill_*.py"))


def _pytest(env_extra: dict) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTEST_XDIST_WORKER": "", **env_extra}
    return subprocess.run([sys.executable, "-m", "pytest", *DRILLS, "-q", "-p", "no:cacheprovider", "-rf", "--tb=line"],
                          cwd=ROOT, env=env, capture_output=True, text=True)


def test_there_are_drills_and_each_names_a_question_page():
    assert len(DRILLS) >= 5
    pages = question_pages()
    for drill in DRILLS:
        m = re.search(r'^PAGE\s*=\s*"([^"]+)"', (ROOT / drill).read_text(encoding="utf-8"), re.M)
        assert m, f"{drill}: declares no PAGE"
        assert m[1] in pages, f"{drill}: PAGE = {m[1]!r} is not a question page"


def test_drills_pass_with_the_reference_code():
    r = _pytest({"DRILLS": "reference"})
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]


def test_blank_drills_fail_until_written():
    r = _pytest({"DRILLS": ""})
    assert r.returncode != 0
    failed = set(re.findall(r"^FAILED (proofs/drills/drill_\w+\.py)", r.stdout, re.M))
    assert failed == set(DRILLS), f"drills that pass without being written: {set(DRILLS) - failed}"
    assert "NotImplementedError" in r.stdout
