"""Print the cheat sheet to build/pdf/cheat-sheet.pdf with headless Chromium (the browser the tests use).

    python docs/hooks/print_pdf.py            # `make pdf` runs this; the next site build links the PDF

It builds the site into a scratch folder, serves it on 127.0.0.1, opens the cheat sheet in Debian's
`chromium` driven by Playwright, waits until KaTeX has rendered the math, and prints with the page's own
print stylesheet (no navigation, light background, one page break per area).
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


def main() -> int:
    if not Path(CHROMIUM).exists():
        print(f"Chromium not found at {CHROMIUM}: install Debian's `chromium` (`make chromium`).", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory(prefix="cheat-sheet-") as tmp:
        env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
        r = subprocess.run([sys.executable, "-m", "mkdocs", "build", "-q", "-d", tmp], cwd=ROOT, env=env,
                           capture_output=True, text=True)
        if r.returncode:
            print(r.stdout + r.stderr, file=sys.stderr)
            return r.returncode
        httpd, url = serve(Path(tmp))
        try:
            path = print_cheatsheet(url)
        finally:
            httpd.shutdown()
    print(f"wrote {path.relative_to(ROOT)} ({path.stat().st_size // 1024} KiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
