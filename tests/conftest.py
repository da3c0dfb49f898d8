"""Fixtures of the site and browser tests: one strict build per test session (per xdist worker), served on
127.0.0.1, and Debian's Chromium driven by Playwright."""

from __future__ import annotations

import fcntl
import functools
import http.server
import json
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path
from urllib.parse import urlparse

import pytest

from tests.pages import ROOT

CHROMIUM = os.environ.get("CHROMIUM", shutil.which("chromium") or "/usr/bin/chromium")
SCREENSHOTS = ROOT / "build" / "screenshots"  # written by the browser tests, never committed


def pytest_collection_modifyitems(config, items):
    """The order that keeps two workers busy (`make test` hands tests out one at a time: --maxschedchunk 1): the
    first test that needs the built site starts the build (about 30 s on one core) while the tests that need no site
    run beside it; then the browser tests, the longest, so that the run does not end on one of them alone."""
    site = [it for it in items if "site" in it.fixturenames]
    if site:
        rest = sorted(site[1:], key=lambda it: "browser" not in it.fixturenames)  # stable: file order kept within
        items[:] = [site[0], *(it for it in items if "site" not in it.fixturenames), *rest]


def evidence_not_ready() -> str:
    """'' when every proof test has passing evidence of its current code; otherwise what is missing, in one line."""
    from proofs import evidence as E
    from proofs.stale import test_names

    bad: dict[str, list[str]] = {"missing": [], "failed": [], "stale": []}
    for proof in sorted((ROOT / "proofs").rglob("proof_*.py")):
        rel, fp = proof.relative_to(ROOT).as_posix(), E.fingerprint(proof)
        for name in test_names(proof):
            doc = E.load(rel, name)
            kind = ("missing" if doc is None else "stale" if doc["provenance"]["fingerprint"] != fp
                    else None if doc["outcome"] == "passed" else "failed")
            if kind:
                bad[kind].append(f"{rel}::{name}")
    if not any(bad.values()):
        return ""
    counts = ", ".join(f"{len(v)} {k}" for k, v in bad.items() if v)
    first = next(v[0] for v in bad.values() if v)
    return (f"The site is built from the proofs' evidence, and {sum(map(len, bad.values()))} proof tests have no "
            f"current passing evidence ({counts}; first: {first}). Run the proofs first: `make proofs` "
            f"(`make test` runs them before these tests).")


@pytest.fixture(scope="session")
def evidence_ready() -> None:
    """Fails, with one message saying to run the proofs, when a test needs evidence that is not there."""
    problem = evidence_not_ready()
    if problem:
        pytest.fail(problem, pytrace=False)


def _build_site(out: Path) -> None:
    """The strict build into `out`, its cheat sheet printed to the PDF that it links (build/pdf/cheat-sheet.pdf, copied
    into the build): `docs/hooks/print_pdf.py --site`, so that printing and the tests share one build. A subprocess:
    Playwright's sync API cannot start inside a test that already holds the browser fixture."""
    r = subprocess.run([sys.executable, "docs/hooks/print_pdf.py", "--site", str(out)], cwd=ROOT, capture_output=True,
                       text=True)
    assert r.returncode == 0, f"the strict build or printing its cheat sheet failed:\n{r.stdout}\n{r.stderr}"


@pytest.fixture(scope="session")
def site(tmp_path_factory, evidence_ready) -> Path:
    """One strict build per test run. Under pytest-xdist the workers share it: the first to ask builds (the others
    wait on a lock, then read it), where each worker used to build its own copy (a full build is about 25 s of CPU).
    The build prints the cheat sheet's PDF and holds it (make test has no separate printing step).
    TEST_SITE_DIR=<a built site> reuses a build instead, to iterate on one browser test."""
    if os.environ.get("TEST_SITE_DIR"):
        return Path(os.environ["TEST_SITE_DIR"])
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    if not run:  # one process: its own build
        out = tmp_path_factory.mktemp("site")
        _build_site(out)
        return out
    shared = tmp_path_factory.getbasetemp().parent / f"site-{run}"  # pytest-N/, the parent of every worker's basetemp
    shared.mkdir(exist_ok=True)
    out, done, failed = shared / "site", shared / "done", shared / "failed"
    with open(shared / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if failed.exists():
            pytest.fail(failed.read_text(encoding="utf-8"), pytrace=False)
        if not done.exists():
            try:
                _build_site(out)
            except AssertionError as e:
                failed.write_text(str(e), encoding="utf-8")
                raise
            done.touch()
    return out


def serve(site: Path, replace: dict[str, bytes] | None = None):
    """Serve `site` on 127.0.0.1 for a fixture: yields the base URL, shuts down after; `replace` answers the given paths
    (e.g. "/search/search_index.json") with other bytes."""
    replace = replace or {}

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):
            body = replace.get(urlparse(self.path).path)
            if body is None:
                return super().do_GET()
            self.send_response(200)
            self.send_header("Content-Type", self.guess_type(self.path))
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(site)))
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()


@pytest.fixture(scope="session")
def server(site):
    """The built site, but its search_index.json has the site's own search settings and no documents. Every page load
    makes Material's search worker fetch and index that file (megabytes: about a third of a page load's CPU), and
    these tests check everything but search; search itself runs on the real index (`search_server`)."""
    config = json.loads((site / "search" / "search_index.json").read_text(encoding="utf-8"))["config"]
    yield from serve(site, {"/search/search_index.json": json.dumps({"config": config, "docs": []}).encode()})


@pytest.fixture(scope="session")
def search_server(site):
    """The built site as it is, with its whole search index."""
    yield from serve(site)


# Nothing may leave the machine: every host name but 127.0.0.1 fails to resolve inside the browser. This replaces a
# Playwright route on every request, which sent each request through Python and (as any route does) turned off the
# browser's HTTP cache, so every page load fetched and compiled the site's scripts again.
OFFLINE = "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1"


@pytest.fixture(scope="session")
def browser():
    if not Path(CHROMIUM).exists():
        pytest.fail(f"Chromium not found at {CHROMIUM}: install Debian's `chromium` (make test does).")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(
            executable_path=CHROMIUM,
            args=["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                  "--disable-sync", "--no-first-run", "--disable-quic", OFFLINE],
        )
        yield b
        b.close()


@pytest.fixture
def page(browser, server):
    """A page that records console errors and every request; the test fails on either an error or a request to any
    host but 127.0.0.1 (which the browser cannot reach anyway: OFFLINE)."""
    ctx = browser.new_context(viewport={"width": 1280, "height": 900})  # wide: the search box is in the header
    pg = ctx.new_page()
    pg.errors, pg.requests = [], []
    pg.on("console", lambda m: pg.errors.append(m.text) if m.type == "error" else None)
    pg.on("pageerror", lambda e: pg.errors.append(str(e)))
    ctx.on("request", lambda r: pg.requests.append(r.url))
    yield pg
    ctx.close()
    outside = [u for u in pg.requests if urlparse(u).hostname not in ("127.0.0.1", None)]
    assert not outside, f"requests left the machine: {outside}"
    assert not pg.errors, f"console errors: {pg.errors}"


@pytest.fixture(autouse=True)
def torch_default_dtype_is_left_as_found():
    """A test that changes torch's default dtype must put it back: under pytest-xdist the tests that run after it in
    the same worker would otherwise build float64 modules and fail far from the cause."""
    import torch

    before = torch.get_default_dtype()
    yield
    after = torch.get_default_dtype()
    if after != before:
        torch.set_default_dtype(before)
        pytest.fail(f"this test changed torch's default dtype from {before} to {after} and left it so; restore it "
                    f"(a fixture that sets it and resets it after the yield).", pytrace=False)

