"""The site: a strict build, then a real headless Chromium (Debian's package, driven by Playwright).

Math must be rendered, evidence cards must show numbers, search must find pages by English and Chinese
terms, the console must stay clean, and no request may leave 127.0.0.1.
"""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import subprocess
import sys
import unicodedata
from pathlib import Path
from urllib.parse import unquote, urlsplit

import yaml

from proofs import evidence as E
from tests.pages import ROOT, question_pages, registry, site_target


def test_strict_build_renders_every_question_page(site):
    for page in question_pages():
        html = (site / page.removesuffix(".md") / "index.html").read_text(encoding="utf-8")
        assert 'class="evidence"' in html, f"{page}: no evidence card"
        assert "<!-- evidence" not in html and "<!-- value" not in html, f"{page}: unrendered marker"
        assert 'class="claims"' in html, f"{page}: no claims table"


def test_a_failed_proof_is_shown_loudly_and_only_the_strict_build_fails(tmp_path, evidence_ready):
    """`make serve` must serve the site when a proof fails: the plain build succeeds with a failure card on that
    page, while `mkdocs build --strict` (the CI build) refuses it, naming the failure. Both builds are of that one
    page (a config inheriting mkdocs.yml, the other pages excluded and links to them not checked): the full builds
    cost about a minute and showed nothing more."""
    evidence = tmp_path / "evidence"
    shutil.copytree(E.EVIDENCE_DIR, evidence)
    page, meta = next(iter(question_pages().items()))
    test = re.search(r"<!--\s*evidence:\s*(\w+)\s*-->", (ROOT / "docs" / page).read_text(encoding="utf-8"))[1]
    victim = evidence / meta["proofs"][0] / f"{test}.json"
    doc = json.loads(victim.read_text(encoding="utf-8"))
    doc["outcome"], doc["failure"] = "failed", "AssertionError: planted failure"
    victim.write_text(json.dumps(doc), encoding="utf-8")
    base = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))
    config = tmp_path / "one-page.yml"
    config.write_text(yaml.safe_dump({
        "INHERIT": str(ROOT / "mkdocs.yml"), "docs_dir": str(ROOT / "docs"),
        "hooks": [str(ROOT / h) for h in base["hooks"]], "nav": [page],
        "exclude_docs": f"*.md\n!/{page}\n",
        "validation": {"nav": {"omitted_files": "ignore", "not_found": "ignore", "absolute_links": "ignore"},
                       "links": {"not_found": "ignore", "anchors": "ignore", "absolute_links": "ignore",
                                 "unrecognized_links": "ignore"}},
    }), encoding="utf-8")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "PROOF_EVIDENCE_DIR": str(evidence)}
    build = [sys.executable, "-m", "mkdocs", "build", "-q", "-f", str(config), "-d"]
    plain = subprocess.run(build + [str(tmp_path / "plain")], cwd=ROOT, capture_output=True, text=True, env=env)
    assert plain.returncode == 0, plain.stderr
    html = (tmp_path / "plain" / page.removesuffix(".md") / "index.html").read_text(encoding="utf-8")
    assert "Evidence failed" in html and "planted failure" in html
    strict = subprocess.run(build + [str(tmp_path / "strict"), "--strict"], cwd=ROOT, capture_output=True, text=True,
                            env=env)
    assert strict.returncode != 0
    assert f"evidence for {meta['proofs'][0]}::{test} is failed" in strict.stdout + strict.stderr, \
        "the strict build failed, but not for the planted failure"


CODE = re.compile(r"<pre\b.*?</pre>|<code\b.*?</code>", re.S)


def test_no_page_shows_an_empty_or_missing_measured_value(site):
    """Every page, the study pages included: each value marker became a number (never an empty comment)."""
    empty = re.compile(r'<span class="value"[^>]*>\s*</span>')
    pages = sorted(site.rglob("*.html"))
    assert len(pages) > len(question_pages())
    for path in pages:
        html = path.read_text(encoding="utf-8")
        where = path.relative_to(site)
        prose = CODE.sub("", html)  # the contributing guide shows the marker's syntax inside code: not a value
        assert "<!-- value" not in prose and "&lt;!-- value" not in prose, f"{where}: an unrendered value marker"
        assert "value--missing" not in html, f"{where}: a measured value is missing"
        assert not empty.search(html), f"{where}: an empty measured value"


CLAIM_ROW = re.compile(r"<tr>\s*<td><code>(C-[A-Z0-9-]+)</code></td>\s*<td>(.*?)</td>", re.S)


def test_every_claims_table_shows_each_claim_as_written(site):
    """The home page's ledger and every question page's claims table show each claim's text as claims.yml has it:
    the ledger is a Markdown table, where a bare | in a claim (ALiBi's −m·|i−j|) split the cell and showed as /."""
    reg = registry()
    seen = set()
    for path in [site / "index.html"] + [site / p.removesuffix(".md") / "index.html" for p in question_pages()]:
        for cid, cell in CLAIM_ROW.findall(path.read_text(encoding="utf-8")):
            shown = html.unescape(re.sub(r"<[^>]+>", "", cell))
            assert shown == reg[cid]["claim"], f"{path.relative_to(site)}: {cid} shows {shown!r}"
            seen.add(cid)
    assert seen == set(reg), f"claims in no table: {sorted(set(reg) - seen)}"
    assert any("|" in c["claim"] for c in reg.values()), "no claim has a | any more: this test checks less"


HREF = re.compile(r"""<a\b[^>]*?\shref=("[^"]*"|'[^']*'|[^\s>]+)""")
ID = re.compile(r"""\sid=("[^"]*"|'[^']*'|[^\s>]+)""")


def test_every_link_within_the_site_reaches_its_page_and_anchor(site):
    """Every relative link of every built page, the ones hooks write into the HTML included (mkdocs checks only the
    Markdown's, and not their anchors in a strict build), leads to a file of the build and, with a #fragment, to an
    element with that id there, the only one with it: a claims table linked a test that had no evidence card on its
    page (kv-eviction), and the tags page had two sections with the id tag:attention (the area "Attention" and the
    topic tag "attention"; the hook now merges tags that differ only in case)."""
    root = site.resolve()
    ids: dict[Path, set[str]] = {}
    broken, n = [], 0
    for f in sorted(root.rglob("*.html")):
        for raw in HREF.findall(f.read_text(encoding="utf-8")):
            ref = html.unescape(raw.strip("\"'"))
            parts = urlsplit(ref)
            if parts.scheme or parts.netloc:
                continue  # another site (or mailto:): not ours to check offline
            n += 1
            target = site_target(root, f.parent, ref)
            if not (target and target.is_file()):
                broken.append(f"{f.relative_to(root)}: {ref} (no such file)")
            elif parts.fragment and target.suffix == ".html":
                if target not in ids:
                    found = [html.unescape(m.strip("\"'")) for m in ID.findall(target.read_text(encoding="utf-8"))]
                    twice = sorted({i for i in found if found.count(i) > 1})
                    assert not twice, f"{target.relative_to(root)}: ids used twice (a link reaches the first): {twice}"
                    ids[target] = set(found)
                if unquote(parts.fragment) not in ids[target]:
                    broken.append(f"{f.relative_to(root)}: {ref} (no such anchor)")
    assert n > 10_000, f"only {n} links read: does the pattern still match the built pages?"
    assert not broken, f"{len(broken)} broken links: {broken[:10]}"


NOT_PROSE = re.compile(r'<(pre|code|script|style|svg|textarea)\b.*?</\1>|<(span|div) class="arithmatex">.*?</\2>', re.S)
LEAKS = {  # Markdown or TeX that a reader would see as text: what each looks like when it leaks
    "an admonition marker": re.compile(r"^\s*(\?\?\?|!!!)\+? ?[a-z]", re.M),
    "bold markers": re.compile(r"\*\*\S"),
    "a $ that opened no formula": re.compile(r"\$[^\s$\d]"),
    "a Markdown link": re.compile(r"\]\([^)]*\)"),
    "a snippet marker": re.compile(r"--8<--"),
    "an HTML tag as text": re.compile(r"</?(div|span|p|details|summary|table|td)\b"),
    "an HTML comment as text": re.compile(r"<!--"),
    "an attribute list": re.compile(r"\{:|\{ *[.#][a-z]|\{ *data-"),
    "TeX outside a formula": re.compile(r"\\\(|\\\[|\\(frac|sqrt|text|max|sum|mathbb)\b"),
}


def test_no_page_shows_markdown_or_tex_as_text(site):
    """The text a reader sees on every built page (code, scripts and formulas left out) holds no Markdown or TeX that
    failed to convert: a | inside $...$ in a table row split the cell and left "$\\max_{kl}" on the page
    (quantisation, fixed with \\lvert \\rvert), and headings with math showed raw \\(w\\) in the table of contents
    (fixed with a plain data-toc-label)."""
    found = []
    for f in sorted(site.rglob("*.html")):
        text = html.unescape(re.sub(r"<[^>]+>", " ", NOT_PROSE.sub(" ", f.read_text(encoding="utf-8"))))
        for what, pattern in LEAKS.items():
            for m in pattern.finditer(text):
                found.append(f"{f.relative_to(site)}: {what}: {' '.join(text[m.start() - 40:m.end() + 40].split())}")
    assert not found, f"{len(found)} leaks: {found[:10]}"


def test_every_figure_has_a_caption_and_a_plain_file_name(evidence_ready):
    """Every figure a proof recorded has a caption (the line under it on the page, and its alt text) and a name of
    lower-case letters, digits, - and _ (its file name): proof_spikes saved "loss curves of every arm" with no caption,
    an image with an empty alt and no line under it, in a file whose name held spaces."""
    figures = [(j, f) for j in sorted(E.EVIDENCE_DIR.rglob("*.json"))
               for f in json.loads(j.read_text(encoding="utf-8")).get("figures", [])]
    assert len(figures) > 50, "fewer figures than the site shows: does this test read the evidence?"
    for j, f in figures:
        where = f"{j.relative_to(E.EVIDENCE_DIR)}: figure {f['name']!r}"
        assert re.fullmatch(r"[a-z0-9_-]+", f["name"]), f"{where}: use a name of a-z, 0-9, - and _"
        assert f["caption"].strip(), f"{where}: no caption (ev.figure(fig, name, caption))"


def test_proof_code_is_included_from_the_file_not_pasted(site):
    """Every page's python code blocks that come from a proof contain that proof's source lines."""
    for page, meta in question_pages().items():
        md = (ROOT / "docs" / page).read_text(encoding="utf-8")
        assert "--8<--" in md, f"{page}: includes no proof code"


def test_question_page_renders_math_and_evidence(page, server):
    page.goto(f"{server}/attention/why-scale-sqrt-dk/")
    page.wait_for_selector(".arithmatex .katex", timeout=10_000)
    leftovers = page.eval_on_selector_all(".arithmatex", "els => els.filter(e => !e.querySelector('.katex')).length")
    assert leftovers == 0, "some math was not rendered by KaTeX"
    body = page.inner_text("article")
    assert "$$" not in body and "\\(" not in body
    nums = page.eval_on_selector_all(".evidence td.num", "els => els.map(e => e.innerText.trim())")
    assert len(nums) >= 5 and all(nums), "evidence cards show no numbers"
    assert page.locator(".evidence").count() >= 5
    figures = page.locator(".evidence figure img")
    assert figures.count() >= 1
    for i in range(figures.count()):  # lazy images load once scrolled into view
        figures.nth(i).scroll_into_view_if_needed()
        page.wait_for_function("e => e.complete && e.naturalWidth > 0", arg=figures.nth(i).element_handle(),
                               timeout=10_000)
    assert page.locator("table.claims .verdict").count() >= 5
    # code copy button from mkdocs-material on the included proof code
    assert page.locator("pre code").count() >= 3


def _search(page, term: str) -> list[str]:
    """Type `term` into the search box of the open page; the result links once the results show."""
    box = "input.md-search__input"
    page.click(box)
    for query in ("", term):  # an empty query lists nothing: the results that show next are this term's
        page.fill(box, query)
        page.press(box, "End")  # Material's search reads the box on a key event, as when a reader types
        if not query:
            page.wait_for_selector(".md-search-result__item", state="detached", timeout=15_000)
    page.wait_for_selector(".md-search-result__item", timeout=15_000)
    return page.eval_on_selector_all(".md-search-result__link", "els => els.map(e => e.getAttribute('href'))")


def test_search_finds_the_layernorm_page(page, search_server):
    """In English and in Chinese, on one page load (each load fetches and indexes the whole search index)."""
    page.goto(f"{search_server}/")
    for term in ["LayerNorm", "层归一化"]:
        hrefs = _search(page, term)
        assert any("layernorm-vs-batchnorm" in h for h in hrefs), f"search for {term!r} returned {hrefs}"


def test_home_page_ledger_links_every_settled_claim(page, server):
    page.goto(f"{server}/")
    ledger = page.inner_text("article")
    for meta in question_pages().values():
        for cid in meta["claims"]:
            assert cid in ledger
    assert page.locator("article .verdict--confirmed").count() >= 1


# Draws each character on a canvas in the article's font stack (Chromium falls back through every installed font, as
# on the page) and compares the pixels with those of an unassigned code point, which only the missing-glyph box draws.
DRAWS_AS_MISSING = """(chars) => {
  const c = document.createElement('canvas'); c.width = 48; c.height = 48;
  const x = c.getContext('2d', {willReadFrequently: true});
  x.font = '32px ' + getComputedStyle(document.querySelector('.md-typeset')).fontFamily;
  const draw = ch => { x.clearRect(0, 0, 48, 48); x.fillText(ch, 4, 36); return x.getImageData(0, 0, 48, 48).data; };
  const box = draw('\\u0378');
  return chars.map(ch => { const d = draw(ch); return d.every((v, i) => v === box[i]); });
}"""


def _shown_characters(site) -> dict[str, str]:
    """Every non-ASCII character a reader sees in the built site's text -> the first page that shows it (scripts,
    styles and inline SVG left out; combining marks, format and control characters left out: they draw nothing alone)."""
    seen: dict[str, str] = {}
    for f in sorted(site.rglob("*.html")):
        text = re.sub(r"<script.*?</script>|<style.*?</style>|<svg.*?</svg>", " ", f.read_text(encoding="utf-8"), flags=re.S)
        entities = html.unescape("".join(set(re.findall(r"&#?\w+;", text))))  # characters written as entities
        for ch in set(re.findall(r"[^\x00-\x7f]", text + entities)):  # tags are ASCII; attributes (titles) are shown
            if unicodedata.category(ch)[0] not in "MCZ":
                seen.setdefault(ch, f.relative_to(site).as_posix())
    return seen


def test_every_character_shown_has_a_glyph(page, server, site):
    """Every character of the built pages draws a glyph in Chromium, not the missing-glyph box. English, Chinese,
    maths and the verdict icons all appear; without an emoji font (Debian's fonts-noto-color-emoji, which `make
    chromium` installs) ✅ and ❌ were empty boxes on the pages, in screenshots and in the printed cheat sheet."""
    shown = _shown_characters(site)
    assert {"✅", "❌", "⚖", "√", "归"} <= set(shown), "the site no longer shows these: update the test"
    page.goto(f"{server}/")
    chars = sorted(shown)
    missing = [f"{c} (U+{ord(c):04X}, {shown[c]})" for c, box in zip(chars, page.evaluate(DRAWS_AS_MISSING, chars)) if box]
    assert not missing, (f"{len(missing)} of {len(chars)} characters have no glyph in Chromium: {missing[:20]}; "
                         f"make chromium installs fonts-noto-cjk and fonts-noto-color-emoji")


def test_search_reads_plain_code_and_pages_keep_their_highlighting(site):
    """docs/hooks/search_plain.py hands the search plugin each highlighted block as plain <pre><code> (a third of the
    build's CPU went into parsing pygments' spans) and search_restore.py gives the page its highlighting back. Held
    against Material's own search parser: on the most code-heavy pages every block yields the same index text."""
    import importlib.util

    from material.plugins.search.plugin import Parser

    spec = importlib.util.spec_from_file_location("search_plain", ROOT / "docs" / "hooks" / "search_plain.py")
    hook = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hook)

    def indexed(html: str) -> list[str]:
        parser = Parser()
        parser.feed(html)
        parser.close()
        return ["".join(s.text) for s in parser.data]

    htmls = {p: p.read_text(encoding="utf-8") for p in site.rglob("index.html")}
    pages = sorted(htmls, key=lambda p: -len(hook.HIGHLIGHT.findall(htmls[p])))[:3]
    blocks = 0
    for path in pages:
        html = htmls[path]
        assert all('<span class="' in m[1] for m in hook.HIGHLIGHT.finditer(html)), \
            f"{path.relative_to(site)}: the built page lost its highlighted code"
        for m in hook.HIGHLIGHT.finditer(html):
            plain = hook.plain_code(m[0])
            assert plain != m[0] and "<span" not in plain
            assert indexed(plain) == indexed(m[0]), f"{path.relative_to(site)}: search would index other text"
            blocks += 1
    assert blocks > 20
