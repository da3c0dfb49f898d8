"""The study features in a real browser (Debian's Chromium driven by Playwright), and every built page.

Each kind of page loads in Chromium with its math rendered, nothing erring in the console and no request leaving
127.0.0.1; every page's files, evidence cards, values and formulas (with the site's own KaTeX, under node) are
checked on the build. A flashcard session is driven by the keyboard and survives a
reload; a flashcard's back is the page's 30-second answer and its push-back is one key (p) away; a mock-interview
round runs against its timer and reveals in two steps (the answer, then the push-back and the wrong answers); the PDF, the Anki deck and a notebook download
and open (the notebook executes). Screenshots go to build/screenshots/ (never committed)."""

from __future__ import annotations

import json
import re
import shutil
import sqlite3
import subprocess
import zipfile
from html.parser import HTMLParser
from pathlib import Path

import pytest

from tests.conftest import SCREENSHOTS
from tests.pages import question_pages, question_urls, site_target

KATEX_DONE = ("() => document.querySelectorAll('.arithmatex').length === "
              "document.querySelectorAll('.arithmatex .katex').length")


def _shot(page, name: str) -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SCREENSHOTS / f"{name}.png"), full_page=False)


# What the crawl reads from each page, in one call: KaTeX errors, evidence cards, measured values, run boxes.
PAGE_FACTS = """() => ({
  katex_errors: document.querySelectorAll('.katex-error').length,
  evidence: document.querySelectorAll('.evidence').length,
  values: [...document.querySelectorAll('.evidence td.num, span.value')].map(e => e.textContent.trim()),
  run_boxes: [...document.querySelectorAll('.admonition-title')].filter(e => e.textContent.includes('Run it yourself')).length,
})"""


def _page_urls(site: Path) -> list[str]:
    urls = sorted(p.parent.relative_to(site).as_posix() + "/" for p in site.rglob("index.html"))
    return ["" if u == "./" else u for u in urls]


ELEMENT = re.compile(r"""<([a-z][a-z0-9]*)\b([^>]*)>""")
CLASSES = re.compile(r"""\sclass=("[^"]*"|'[^']*'|[^\s>]+)""")


def _kinds(html: str) -> set[str]:
    """The kinds of element a page holds outside its code blocks: each tag, and each tag.class pair."""
    kinds = set()
    for tag, attrs in ELEMENT.findall(CODE_BLOCK.sub("", html)):
        m = CLASSES.search(attrs)
        kinds |= {tag} | {f"{tag}.{c}" for c in (m[1].strip("\"'").split() if m else [])}
    return kinds


def _crawled(site: Path) -> list[str]:
    """The pages the browser loads: every page that is not a question page (home, study pages, tags, seeds, at scale,
    contributing: each has its own template or script), and as few question pages as hold, between them, every kind
    of element (tag, and tag with class) found on any question page, chosen greedily (the most new kinds first, ties
    by URL), so each kind is rendered and scripted in Chromium at least once. Question pages share one template and
    one set of scripts; what differs from one to the next (its math, evidence, values, figures, the files it loads
    and its inline scripts) is checked on every built page by the tests below, with the same KaTeX file the browser
    runs. Loading all 95 pages took 84-160 s of the tests' CPU, a third of it."""
    questions = question_urls()
    kinds = {u: _kinds((site / u / "index.html").read_text(encoding="utf-8")) for u in _page_urls(site)
             if u in questions}
    left, chosen = set().union(*kinds.values()), []
    while left:
        best = max(sorted(kinds), key=lambda u: len(kinds[u] & left))
        chosen.append(best)
        left -= kinds[best]
    return sorted({u for u in _page_urls(site) if u not in questions} | set(chosen))


CRAWL_SHARDS = 2  # the crawl is the slowest browser test: in shards, pytest-xdist spreads it over the workers


@pytest.mark.parametrize("shard", range(CRAWL_SHARDS))
def test_each_kind_of_page_renders_cleanly_in_chromium(page, server, site, page_facts, shard):
    """Load each kind of page (`_crawled`; this shard: every CRAWL_SHARDS-th of them): math rendered, evidence
    present on question pages, no empty value (the page fixture fails the test on any console error or request off
    127.0.0.1). What Chromium finds is also what `_Facts` reads from the same file, so the checks of every page on
    the build below are held against the browser on these."""
    questions = question_urls()
    urls = _crawled(site)
    assert len(urls) > 8 and set(urls) & questions, urls
    for u in urls[shard::CRAWL_SHARDS]:
        page.goto(f"{server}/{u}")
        page.wait_for_function(KATEX_DONE, timeout=15_000)
        facts = page.evaluate(PAGE_FACTS)
        assert facts["katex_errors"] == 0, f"/{u}: KaTeX could not parse some math"
        built = page_facts[u]
        assert (facts["evidence"], facts["values"], facts["run_boxes"]) == (built.evidence, built.values,
                                                                           built.run_boxes), f"/{u}: _Facts misreads"
        assert page.evaluate("document.querySelectorAll('.arithmatex').length") == len(built.math), u
        if u in questions:
            assert facts["evidence"] >= 1, f"/{u}: no evidence card"
            # textContent, not innerText: a value inside a closed follow-up is not rendered and has no innerText
            assert facts["values"] and all(facts["values"]), f"/{u}: an empty measured value"
            assert facts["run_boxes"] == 1, f"/{u}: no run box"


NOT_FETCHED = {"canonical", "alternate", "next", "prev", "author", "license", "search"}  # <link rel> left unloaded
CSS_URL = re.compile(r"""url\(\s*(['"]?)([^'")]+)\1\s*\)""")  # url(...) in a stylesheet or a style attribute
PAGE_BASE = re.compile(r'new URL\("[^"]*",location\)')  # the one part of Material's inline scripts that varies


class _Facts(HTMLParser):
    """What a built page asks the browser to fetch, the scripts it runs inline and any on* handler, its math as
    KaTeX's auto-render finds it (one text node in each `.arithmatex` element), its evidence cards, measured values
    and run boxes (the same facts as PAGE_FACTS, read from the file)."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.fetched: list[str] = []  # src, srcset, poster, <object data>, <link href> that load, url() in styles
        self.scripts: list[str] = []  # inline scripts the browser runs, with the page's base path taken out
        self.handlers: list[str] = []  # on* attributes: script a page runs that no file holds
        self.unseen_math: list[str] = []  # a tag or comment inside a formula: auto-render would not read it whole
        self.math: list[str] = []
        self.evidence = self.run_boxes = 0
        self._in_evidence = 0  # depth of <div> inside the evidence card being read (0: outside every card)
        self.values: list[str] = []
        self._open: list[tuple[str, str, list[str]]] = []  # (tag, what, text) of the elements being read

    def _in_math(self) -> bool:
        return any(what == "math" for _, what, _ in self._open)

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        classes = (a.get("class") or "").split()
        if self._in_math():
            self.unseen_math.append(f"<{tag}>")
        for name, value in attrs:
            if value is None:
                continue
            if name.startswith("on"):
                self.handlers.append(f"<{tag} {name}>")
            if name in ("src", "poster") or (name, tag) == ("data", "object") or (
                    name in ("href", "xlink:href") and tag in ("image", "use")) or (
                    (name, tag) == ("href", "link") and not NOT_FETCHED & set((a.get("rel") or "").split())):
                self.fetched.append(value)
            elif name == "srcset":
                self.fetched += [c.split()[0] for c in value.split(",") if c.strip()]
            elif name == "style":
                self.fetched += [m[1] for m in CSS_URL.findall(value)]
        if tag == "div" and (self._in_evidence or "evidence" in classes):
            self.evidence += not self._in_evidence
            self._in_evidence += 1
        what = ("math" if "arithmatex" in classes else "value" if (tag == "span" and "value" in classes) or
                (tag == "td" and "num" in classes and self._in_evidence) else
                "title" if "admonition-title" in classes else
                "script" if tag == "script" and not a.get("src") and a.get("type") in (None, "", "text/javascript",
                                                                                     "module") else
                "style" if tag == "style" else None)
        if what:
            self._open.append((tag, what, []))
        elif self._open and tag == self._open[-1][0]:
            self._open.append((tag, "", []))  # the same tag nested inside: its end is not ours

    def handle_comment(self, data):
        if self._in_math():
            self.unseen_math.append("<!-- -->")

    def handle_endtag(self, tag):
        if tag == "div" and self._in_evidence:
            self._in_evidence -= 1
        if self._open and self._open[-1][0] == tag:
            _, what, text = self._open.pop()
            text = "".join(text)
            if what == "math":
                self.math.append(text)
            elif what == "value":
                self.values.append(text.strip())
            elif what == "title":
                self.run_boxes += "Run it yourself" in text
            elif what == "script":
                self.scripts.append(PAGE_BASE.sub("new URL(BASE,location)", text.strip()))
            elif what == "style":
                self.fetched += [m[1] for m in CSS_URL.findall(text)]
            if self._open:
                self._open[-1][2].append(text)

    def handle_data(self, data):
        if self._open:
            self._open[-1][2].append(data)


CODE_BLOCK = re.compile(r"<pre\b.*?</pre>", re.S)  # highlighted proof code: half of each page, none of the facts
FACT_CLASS = re.compile(r"""class=["']?[^"'>]*\b(value|arithmatex|evidence|admonition-title)\b""")


@pytest.fixture(scope="module")
def page_facts(site) -> dict[str, _Facts]:
    facts = {}
    for u in _page_urls(site):
        text = (site / u / "index.html").read_text(encoding="utf-8")
        hidden = [m[1] for block in CODE_BLOCK.findall(text) for m in FACT_CLASS.finditer(block)]
        assert not hidden, f"/{u}: a {hidden[0]} element inside a <pre> block, which _Facts skips"
        parser = _Facts()
        parser.feed(CODE_BLOCK.sub("", text))
        parser.close()
        facts[u] = parser
    return facts


def _built_file(site: Path, page: str, ref: str) -> Path | None:
    """The non-empty file of the build that `ref`, fetched from the page or stylesheet at site/page, loads; None if
    it is on another host, outside the site or missing."""
    target = site_target(site, (site / page).resolve(), ref)
    return target if target and target.is_file() and target.stat().st_size else None


def test_every_page_shows_its_evidence_and_fetches_only_its_own_files(site, page_facts):
    """On every built page: each file the browser would fetch (scripts, styles, figures, icons, and the fonts and
    images those stylesheets name) is a file of the build, never another host (a missing one is the console error a
    crawl would have seen); it runs no inline script that a page Chromium loads (`_crawled`) does not run too, and no
    on* handler; a question page has evidence cards, a value in every measured cell and one run box."""
    questions = question_urls()
    assert set(questions) <= set(page_facts)
    run_in_chromium = {s for u in _crawled(site) for s in page_facts[u].scripts}
    assert run_in_chromium, "no inline script found: does _Facts still read them?"
    stylesheets: set[Path] = set()
    for u, f in page_facts.items():
        assert f.fetched, f"/{u}: fetches nothing, so this test reads the page wrongly"
        for ref in f.fetched:
            if ref.startswith("data:"):
                continue
            target = _built_file(site, u, ref)
            assert target, f"/{u}: fetches {ref}, which is not a file of the build"
            if target.suffix == ".css":
                stylesheets.add(target)
        assert not f.handlers, f"/{u}: inline handlers {f.handlers}"
        new = [s[:80] for s in f.scripts if s not in run_in_chromium]
        assert not new, f"/{u}: inline scripts that no page loaded in Chromium runs: {new}"
        if u in questions:
            assert f.evidence >= 1, f"/{u}: no evidence card"
            assert f.values and all(f.values), f"/{u}: an empty measured value"
            assert f.run_boxes == 1, f"/{u}: {f.run_boxes} run boxes"
    assert any(css.name == "katex.min.css" for css in stylesheets)
    for css in sorted(stylesheets):  # KaTeX's fonts load only on a page whose math needs them
        for _, ref in CSS_URL.findall(css.read_text(encoding="utf-8")):
            if not ref.startswith("data:"):
                page = css.parent.relative_to(site.resolve()).as_posix()
                assert _built_file(site, page, ref), f"{css.name} names {ref}, which is not a file of the build"


KATEX_CHECK = """
const katex = require(process.argv[1]);
const out = [];
for (const [tex, display] of JSON.parse(require("fs").readFileSync(0, "utf8"))) {
  try { katex.renderToString(tex, {displayMode: display, throwOnError: true}); }
  catch (e) { out.push([tex, display, String(e.message)]); }
}
process.stdout.write(JSON.stringify(out));
"""


def test_every_formula_on_every_page_parses_with_the_sites_katex(site, page_facts):
    """Every `.arithmatex` element of every built page holds one formula, as one text node, between the delimiters
    that javascripts/katex-init.js gives KaTeX's auto-render, and the KaTeX file the site ships
    (assets/katex/katex.min.js, run by node) renders it with throwOnError. Stricter than the browser: there
    (throwOnError off) an unknown command is drawn in red inside the formula, not as a `.katex-error`, so a crawl
    counting those passed a page that showed `c^\\*` as a red backslash (inference/kv-cache-quantisation, fixed with
    the test)."""
    if not shutil.which("node"):
        pytest.fail("node is not installed: `make setup` installs KaTeX with npm, which needs node", pytrace=False)
    formulas: dict[tuple[str, bool], str] = {}
    for u, f in page_facts.items():
        assert not f.unseen_math, f"/{u}: {f.unseen_math[0]} inside a formula: auto-render would skip it"
        for m in f.math:
            m = m.strip()
            display = m.startswith("\\[")
            inner = m[2:-2]
            assert (m[:2], m[-2:]) in {("\\(", "\\)"), ("\\[", "\\]")} and m[-2:] not in inner, \
                f"/{u}: math that auto-render would not find whole: {m[:80]}"
            formulas.setdefault((inner, display), u)
    assert len(formulas) > 1000, "the pages show less math than they did: does this test still read them?"
    r = subprocess.run(["node", "-e", KATEX_CHECK, str(site / "assets" / "katex" / "katex.min.js")],
                       input=json.dumps(list(formulas)), capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    failed = [f"/{formulas[(tex, display)]}: {tex[:60]} ({why})" for tex, display, why in json.loads(r.stdout)]
    assert not failed, f"{len(failed)} formulas KaTeX cannot parse: {failed[:10]}"


def test_home_and_question_pages_screenshots(page, server):
    page.goto(f"{server}/")
    _shot(page, "home")
    page.goto(f"{server}/attention/masks/")
    page.wait_for_function(KATEX_DONE, timeout=15_000)
    assert page.locator(".thirty-pair .admonition").count() == 2, "English and Chinese answers side by side"
    assert page.locator("[lang=zh]").first.inner_text().strip()
    _shot(page, "question")


def test_flashcards_by_keyboard_and_progress_survives_reload(page, server):
    page.goto(f"{server}/study/flashcards/")
    page.wait_for_selector(".kb-progress")
    before = page.inner_text(".kb-progress")
    due = int(before.split()[0])
    total = page.locator(".kb-deck .kb-card").count()
    assert due == total > len(question_pages()), before  # a fresh browser: every card is due
    first = page.locator(".kb-card.is-current").get_attribute("data-id")
    assert not page.locator(".kb-card.is-current .kb-card__back").is_visible()
    page.keyboard.press("Space")
    assert page.locator(".kb-card.is-current .kb-card__back").is_visible()
    _shot(page, "flashcard")
    page.keyboard.press("3")  # easy: due in a day
    assert page.locator(".kb-card.is-current").get_attribute("data-id") != first
    page.keyboard.press("ArrowRight")
    page.keyboard.press("Space")
    page.keyboard.press("1")  # again: due in a minute
    after = page.inner_text(".kb-progress")
    assert after.startswith(f"{due - 2} due · 1 learned"), after
    page.reload()
    page.wait_for_selector(".kb-progress")
    assert page.inner_text(".kb-progress") == after  # local storage kept the grades
    store = json.loads(page.evaluate("localStorage.getItem('kb-study-v1')"))
    assert store["cards"][first]["box"] == 2
    # one area's deck, and the Chinese side of a card
    page.select_option(".kb-areas", "attention")
    n_attention = page.locator(".kb-card[data-area=attention]").count()
    assert page.inner_text(".kb-progress").endswith(f"{n_attention} cards")
    page.click(".kb-lang")
    zh_cards = page.locator(".kb-card.is-current.has-zh")
    if zh_cards.count():
        assert page.locator(".kb-card.is-current .kb-card__front-zh").is_visible()
    assert "待复习" in page.inner_text(".kb-progress")


def test_mock_interview_round(page, server):
    page.goto(f"{server}/study/mock-interview/")
    page.wait_for_selector(".kb-start")
    page.select_option(".kb-seconds", "60")
    page.click(".kb-start")
    assert page.locator(".kb-card.is-current").count() == 1
    page.wait_for_timeout(1200)
    left = page.inner_text(".kb-timer")
    assert left.startswith("0:5"), left  # counting down from 1:00
    page.fill(".kb-notes", "softmax saturates, so ...")
    page.click(".kb-reveal")
    assert page.locator(".kb-card.is-current .kb-card__back").is_visible()
    if page.locator(".kb-card.is-current .kb-card__wrong").count():  # the second step shows the wrong answers
        assert not page.locator(".kb-card.is-current .kb-card__wrong").is_visible()
        page.click(".kb-push")
        assert page.locator(".kb-card.is-current .kb-card__wrong").is_visible()
    _shot(page, "mock-interview")
    page.click(".kb-grade[data-grade='2']")
    assert page.inner_text(".kb-round").endswith("2")
    store = json.loads(page.evaluate("localStorage.getItem('kb-study-v1')"))
    assert len(store["cards"]) == 1  # the same store as the flashcards


def _pushback_card(page) -> tuple[str, str]:
    """(data-id, area) of the first question card (navigation order) whose page has the push-back boxes."""
    found = page.eval_on_selector_all(
        ".kb-deck .kb-card[data-kind=question]",
        "cs => cs.filter(c => c.querySelector('.kb-card__push')).map(c => [c.dataset.id, c.dataset.area])")
    if not found:
        pytest.skip('no question page has an "If they push back" box yet, so there is no push-back to reveal '
                    "(grep -l 'tip \"If they push back\"' docs/*/*.md)")
    return found[0][0], found[0][1]


def test_flashcard_back_is_the_crisp_answer_and_p_shows_the_push_back(page, server):
    page.goto(f"{server}/study/flashcards/")
    page.wait_for_selector(".kb-progress")
    target, area = _pushback_card(page)
    page.select_option(".kb-areas", area)
    current = page.locator(".kb-card.is-current")
    for _ in range(page.locator(f".kb-card[data-area={area}]").count()):
        if current.get_attribute("data-id") == target:
            break
        page.keyboard.press("ArrowRight")
    assert current.get_attribute("data-id") == target
    back, push, button = current.locator(".kb-card__back"), current.locator(".kb-card__push"), page.locator(".kb-push")
    assert not back.is_visible() and not push.is_visible() and not button.is_visible()
    page.keyboard.press("Space")
    page.wait_for_function(KATEX_DONE, timeout=15_000)
    # the back: the crisp answer, its verdict chips, the link to the page; the push-back stays hidden
    assert back.is_visible() and not push.is_visible() and button.is_visible()
    assert back.locator(".verdict").count() >= 1
    link = back.locator("a", has_text="Derivation and proof")
    assert link.count() == 1
    first_paragraph = back.locator("p").first.inner_text().strip()
    current.evaluate("e => window.scrollTo(0, e.getBoundingClientRect().top + window.scrollY - 70)")
    _shot(page, "flashcard-back")
    page.keyboard.press("p")
    assert push.is_visible() and button.get_attribute("aria-expanded") == "true"
    assert push.locator(".kb-label").inner_text().strip().lower() == "if they push back"
    assert push.locator("p > strong").count() >= 2, "at least two probes, each a bold question"
    assert all(q.strip().endswith(('?"', "?", '?”')) for q in push.locator("p > strong").all_inner_texts())
    _shot(page, "flashcard-pushback")
    page.keyboard.press("p")  # the same key hides it again; the button shows it
    assert not push.is_visible()
    button.click()
    assert push.is_visible()
    if "has-push-zh" in (current.get_attribute("class") or ""):  # Chinese mode: the Chinese push-back
        page.click(".kb-lang")
        assert current.locator(".kb-card__push-zh").is_visible() and not push.is_visible()
        assert "如果面试官追问" in button.inner_text()
        _shot(page, "flashcard-pushback-zh")
        page.click(".kb-lang")
    # the back is the page's own 30-second answer: its first paragraph reads the same there
    href = link.get_attribute("href")
    page.keyboard.press("3")  # the grading keys still work after p
    assert current.get_attribute("data-id") != target
    page.goto(f"{server}/study/flashcards/{href}")
    page.wait_for_function(KATEX_DONE, timeout=15_000)
    box = page.locator(".admonition.abstract:has(.admonition-title:text-is('The 30-second answer'))")
    assert box.locator("p:not(.admonition-title)").first.inner_text().strip() == first_paragraph


def test_mock_interview_reveals_answer_then_push_back(page, server):
    page.goto(f"{server}/study/mock-interview/")
    page.wait_for_selector(".kb-start")
    _, area = _pushback_card(page)
    for box in page.locator(".kb-area-choices input").all():  # only the area of a page with a push-back
        box.set_checked(box.get_attribute("value") == area)
    page.click(".kb-start")
    current = page.locator(".kb-card.is-current")
    for _ in range(200):  # questions are drawn at random from the area: draw until one has its push-back
        if current.locator(".kb-card__push").count():
            break
        page.click(".kb-stage > .kb-next")
    assert current.locator(".kb-card__push").count(), "no question with a push-back drawn in 200 tries"
    back, push, wrong = (current.locator(c) for c in (".kb-card__back", ".kb-card__push", ".kb-card__wrong"))
    assert not back.is_visible() and not page.locator(".kb-push").is_visible()
    page.click(".kb-reveal")  # step 1: the crisp answer only
    assert back.is_visible() and not push.is_visible()
    assert not wrong.count() or not wrong.is_visible()
    assert page.locator(".kb-grade[data-grade='2']").is_visible()
    page.click(".kb-push")  # step 2: the push-back and the common wrong answers
    assert push.is_visible()
    if wrong.count():
        assert wrong.is_visible() and wrong.locator(".kb-label").inner_text().strip().lower() == "common wrong answers"
    page.wait_for_function(KATEX_DONE, timeout=15_000)
    push.evaluate("e => window.scrollTo(0, e.getBoundingClientRect().top + window.scrollY - 200)")
    _shot(page, "mock-interview-pushback")
    page.click(".kb-notes")
    page.keyboard.press("p")  # typing notes: p is a letter, not the key
    assert push.is_visible() and page.input_value(".kb-notes").endswith("p")
    page.click(".kb-timer")
    page.keyboard.press("p")
    assert not push.is_visible()
    page.click(".kb-grade[data-grade='3']")
    assert page.inner_text(".kb-round").endswith("2")


def test_cheat_sheet_pdf_downloads_and_has_pages(page, server, tmp_path):
    page.goto(f"{server}/study/cheat-sheet/")
    page.wait_for_function(KATEX_DONE, timeout=15_000)
    _shot(page, "cheat-sheet")
    assert page.locator(".cheat-area").count() >= 6
    assert page.locator(".cheat-area", has_text="If they push back").count() == 0  # crisp answers only
    with page.expect_download() as d:
        page.click("a[href$='cheat-sheet.pdf']")
    path = tmp_path / "cheat-sheet.pdf"
    d.value.save_as(path)
    data = path.read_bytes()
    assert data.startswith(b"%PDF") and data.count(b"/Type /Page") > 6


def test_anki_deck_has_one_note_per_card(page, server, tmp_path):
    page.goto(f"{server}/study/flashcards/")
    n_cards = page.locator(".kb-deck .kb-card").count()
    with page.expect_download() as d:
        page.click("a[href$='.apkg']")
    path = tmp_path / "deck.apkg"
    d.value.save_as(path)
    with zipfile.ZipFile(path) as z:
        z.extract("collection.anki2", tmp_path)
    con = sqlite3.connect(tmp_path / "collection.anki2")
    assert con.execute("select count(*) from notes").fetchone()[0] == n_cards
    con.close()


def test_notebook_downloads_and_executes(page, server, tmp_path):
    import nbformat
    from nbclient import NotebookClient

    page.goto(f"{server}/positions/sinusoidal-encoding/")
    link = page.locator(".admonition a[download][href$='.ipynb']").first
    with page.expect_download() as d:
        link.click()
    path = tmp_path / "proof.ipynb"
    d.value.save_as(path)
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    assert {c.cell_type for c in nb.cells} == {"markdown", "code"}
    NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}).execute()
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []) if o.output_type == "error"]
    assert not errors
