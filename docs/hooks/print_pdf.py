"""Print the cheat sheet to build/pdf/cheat-sheet.pdf with headless Chromium (the browser the tests use).

    python docs/hooks/print_pdf.py              # `make pdf` runs this; the next site build links the PDF
    python docs/hooks/print_pdf.py --site DIR    # and keep the strict build it printed from, the PDF linked and in it

It builds the site (a build that links the PDF it is about to get), serves it on 127.0.0.1, opens the cheat sheet in
Debian's `chromium` driven by Playwright, waits until KaTeX has rendered the math, prints with the page's own print
stylesheet (no navigation, light background, one page break per area), and copies the PDF into the build. The
tests' site fixture builds through here, so one build serves both the PDF and the tests.
"""

from __future__ import annotations

import functools
import http.server
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "build" / "pdf" / "cheat-sheet.pdf"
CHROMIUM = os.environ.get("CHROMIUM", shutil.which("chromium") or "/usr/bin/chromium")
# Set for the build that build_and_print prints: the hook (docs/hooks/evidence.py) links the PDF before it exists, and
# the PDF is copied into that build after printing (one build, where printing and then linking took two).
PDF_PENDING = "KB_PDF_PRINTED_INTO_BUILD"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run", "--disable-quic"]


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


def serve(folder: Path) -> tuple[http.server.ThreadingHTTPServer, str]:
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=str(folder)))
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd, f"http://127.0.0.1:{httpd.server_address[1]}"


def print_cheatsheet(base_url: str, out: Path = OUT, browser=None) -> Path:
    """Print {base_url}/study/cheat-sheet/ to `out`; uses `browser` (a Playwright Browser) or launches Chromium."""
    from playwright.sync_api import sync_playwright

    def run(b):
        page = b.new_page()
        page.goto(f"{base_url}/study/cheat-sheet/", wait_until="load")
        page.wait_for_function("() => document.querySelectorAll('.arithmatex').length === "
                               "document.querySelectorAll('.arithmatex .katex').length", timeout=30_000)
        page.emulate_media(media="print")
        out.parent.mkdir(parents=True, exist_ok=True)
        page.pdf(path=str(out), format="A4", print_background=False,
                 margin={"top": "15mm", "bottom": "15mm", "left": "12mm", "right": "12mm"})
        page.close()

    if browser is not None:
        run(browser)
        return out
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            run(b)
        finally:
            b.close()
    return out


def build_and_print(site: Path, strict: bool = True) -> Path:
    """Build the site into `site` (strict by default), print its cheat sheet to build/pdf/cheat-sheet.pdf and copy
    the PDF into the build, where its pages already link it. Raises RuntimeError with mkdocs' output on a failed
    build."""
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", PDF_PENDING: "1"}
    r = subprocess.run([sys.executable, "-m", "mkdocs", "build", "-q", *(["--strict"] if strict else []),
                        "-d", str(site)], cwd=ROOT, env=env, capture_output=True, text=True)
    if r.returncode:
        raise RuntimeError(f"mkdocs build{' --strict' if strict else ''} failed:\n{r.stdout}\n{r.stderr}")
    httpd, url = serve(site)
    try:
        path = print_cheatsheet(url)
    finally:
        httpd.shutdown()
    shutil.copyfile(path, site / "study" / "cheat-sheet.pdf")
    return path


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--site", type=Path, help="build into this folder and keep it (default: a scratch folder)")
    args = ap.parse_args(argv)
    if not Path(CHROMIUM).exists():
        print(f"Chromium not found at {CHROMIUM}: install Debian's `chromium` (`make chromium`).", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory(prefix="cheat-sheet-") as tmp:
        try:
            path = build_and_print(args.site or Path(tmp), strict=args.site is not None)
        except RuntimeError as e:
            print(e, file=sys.stderr)
            return 1
    print(f"wrote {path.relative_to(ROOT)} ({path.stat().st_size // 1024} KiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
