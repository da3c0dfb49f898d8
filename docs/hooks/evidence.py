"""MkDocs hook: put each proof's evidence into its page, and keep pages, claims and proofs linked.

A question page declares in its front matter

    claims:  {C-SCALE-1: confirmed, ...}   # claim id -> verdict
    proofs:  [proofs/attention/proof_scale_sqrt_dk.py]

and places markers in its body:

    <!-- claims -->                 the table of claims this page settles, with verdicts and outcomes
    <!-- evidence: test_name -->    the evidence card of one proof test (numbers, figure, provenance)
    <!-- value: test_name / name --> one measured value inline in the prose (never typed by hand)

The home page's `<!-- ledger -->` becomes the ledger of every claim in proofs/claims.yml; the study
pages' `<!-- cheatsheet -->` and `<!-- flashcards -->` collect every question page's 30-second answer
and interviewer follow-ups.
KaTeX comes from the npm registry at set-up (build/npm) and is added to the site here.

Evidence that is missing, failed, or whose fingerprint no longer matches the proof's code
is never shown as current: the card says so and the build warns (so --strict fails).
"""

from __future__ import annotations

import html
import json
import logging
import os
import posixpath
import re
import sys
from pathlib import Path

import yaml
from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File, Files
from mkdocs.utils.meta import get_data

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from proofs import evidence as E  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import scale_box  # noqa: E402  (docs/hooks/scale_box.py: the "At scale" boxes, from bench/at_scale/)
import study  # noqa: E402  (docs/hooks/study.py: the study material, built from the same pages)
from print_pdf import PDF_PENDING  # noqa: E402  (set while print_pdf builds the site it prints and then completes)

log = logging.getLogger("mkdocs.hooks.evidence")
KATEX_DIST = ROOT / "build" / "npm" / "node_modules" / "katex" / "dist"
KATEX_FILES = ["katex.min.js", "katex.min.css", "contrib/auto-render.min.js"]
EVIDENCE_MARK = re.compile(r"<!--\s*evidence:\s*(?:(?P<proof>[\w./-]+\.py)::)?(?P<test>\w+)\s*-->")
VALUE_MARK = re.compile(r"<!--\s*value:\s*(?:(?P<proof>[\w./-]+\.py)::)?(?P<test>\w+)\s*/\s*(?P<name>(?:(?!-->).)+?)\s*-->")
VERDICT_ICON = {"confirmed": "✅", "nuanced": "⚖️", "refuted": "❌"}

_registry: dict[str, dict] = {}
_pages: dict[str, dict] = {}  # src_uri -> front matter of every question page
_bodies: dict[str, str] = {}  # src_uri -> Markdown body of every question page (for the study pages)
_problems: list[str] = []  # evidence that could not be shown as current, reported again after the build
_questions: list = []  # study.Question of every question page, in navigation order
_nav: list[str] = []  # page paths in the order of mkdocs.yml's nav
_drills: dict[str, list[str]] = {}  # page -> its coding drills
_built: dict[str, str] = {}  # study artefacts present in this build: "pdf", "anki" -> their URIs
BUILD = ROOT / "build"
PDF = BUILD / "pdf" / "cheat-sheet.pdf"  # made by `make pdf` (docs/hooks/print_pdf.py), linked when present


def _fig_uri(proof_rel: str, file: str) -> str:
    return f"evidence/{proof_rel.removeprefix('proofs/').removesuffix('.py')}/{file}"


_fingerprints: dict[str, str] = {}  # proof file -> its code fingerprint, computed once per build (emptied in on_config)


def _fingerprint(proof_rel: str) -> str:
    """E.fingerprint of a proof, memoised for one build: a page asks for it once per value marker, and hashing the
    proof with everything it imports is most of a build's time otherwise."""
    if proof_rel not in _fingerprints:
        _fingerprints[proof_rel] = E.fingerprint(ROOT / proof_rel)
    return _fingerprints[proof_rel]


def on_config(config):
    global _registry, _nav
    _fingerprints.clear()  # `mkdocs serve` rebuilds after edits: fingerprints are recomputed for each build
    _nav = study.nav_order(config.get("nav"))
    _registry = yaml.safe_load((ROOT / "proofs" / "claims.yml").read_text(encoding="utf-8"))
    missing = [f for f in KATEX_FILES if not (KATEX_DIST / f).exists()]
    if missing:
        raise PluginError(
            f"KaTeX is not installed ({KATEX_DIST} lacks {missing}). Run `make setup` "
            f"(it runs `npm install katex` into build/npm)."
        )
    return config


def on_files(files: Files, config) -> Files:
    # KaTeX, from the npm package, served under assets/katex/
    for path in KATEX_DIST.rglob("*"):
        rel = path.relative_to(KATEX_DIST).as_posix()
        if path.is_file() and (rel in KATEX_FILES or rel.startswith("fonts/")):
            files.append(File.generated(config, f"assets/katex/{rel}", abs_src_path=str(path)))
    # every figure the proofs wrote
    for svg in sorted(E.EVIDENCE_DIR.rglob("*.svg")) if E.EVIDENCE_DIR.is_dir() else []:
        rel = svg.relative_to(E.EVIDENCE_DIR)
        proof_rel = rel.parent.as_posix()
        files.append(File.generated(config, _fig_uri(proof_rel, svg.name), abs_src_path=str(svg)))
    # front matter of every page, for the ledger (the home page is rendered before the others)
    _pages.clear()
    _bodies.clear()
    _problems.clear()
    for f in files.documentation_pages():
        body, meta = get_data(Path(f.abs_src_path).read_text(encoding="utf-8"))
        if meta.get("claims"):
            _pages[f.src_uri] = meta
            _bodies[f.src_uri] = body
    _questions[:] = study.in_nav_order([study.question(u, m, _bodies[u], AREA_TITLES) for u, m in _pages.items()], _nav)
    _drills.clear()
    _drills.update(study.drills(ROOT))
    # study artefacts: every proof as a notebook, the cards as an Anki deck, the cheat sheet's PDF if made
    _built.clear()
    for uri, path in study.notebooks(ROOT, BUILD / "site-extra").items():
        files.append(File.generated(config, uri, abs_src_path=str(path)))
    apkg = BUILD / "site-extra" / "study" / "transformer-proofs.apkg"
    plain = lambda text, uri: MD_PLAIN_LINK.sub(  # noqa: E731
        r"\1", _render_values(_evidence_links(text, uri), uri, _pages[uri].get("proofs") or []))
    study.anki_deck(_questions, plain, apkg, config.get("site_url"))
    files.append(File.generated(config, "study/transformer-proofs.apkg", abs_src_path=str(apkg)))
    _built["anki"] = "study/transformer-proofs.apkg"
    if os.environ.get(PDF_PENDING):
        _built["pdf"] = "study/cheat-sheet.pdf"  # print_pdf writes the file into the built site after printing it
    elif PDF.exists():
        files.append(File.generated(config, "study/cheat-sheet.pdf", abs_src_path=str(PDF)))
        _built["pdf"] = "study/cheat-sheet.pdf"
    return files


def on_page_read_source(page, config):
    """Question pages get their area, difficulty and "asked often" as tags (the tags page lists them)."""
    path = Path(page.file.abs_src_path) if page.file.abs_src_path else None
    if path is None or not path.suffix == ".md":
        return None
    text = path.read_text(encoding="utf-8")
    body, meta = get_data(text)
    if not meta.get("claims") or not text.startswith("---\n"):
        return None
    area = page.file.src_uri.split("/")[0]
    added = study.tags_of(meta, AREA_TITLES.get(area, area))
    # A topic tag that differs from an area's or an added tag only in case ("attention", the area "Attention") is the
    # same tag: both would get the id tag:attention on the tags page, two sections a reader could not tell apart.
    spelled = {str(t).lower(): t for t in [*AREA_TITLES.values(), *added]}
    own = [spelled.get(str(t).lower(), t) for t in meta.get("tags") or []]
    meta["tags"] = list(dict.fromkeys([*own, *added]))
    return "---\n" + yaml.safe_dump(meta, allow_unicode=True, sort_keys=False) + "---\n" + body


# ----------------------------------------------------------------------------------------------
# Rendering
# ----------------------------------------------------------------------------------------------


def _badge(verdict: str) -> str:
    return f'<span class="verdict verdict--{verdict}">{VERDICT_ICON[verdict]} {verdict}</span>'


def _status(doc: dict | None, proof_rel: str) -> str:
    """'current', 'missing', 'stale' or 'failed'."""
    if doc is None:
        return "missing"
    if doc["provenance"]["fingerprint"] != _fingerprint(proof_rel):
        return "stale"
    return "current" if doc["outcome"] == "passed" else "failed"


def _rel(page, target_uri: str) -> str:
    """For Markdown links: relative to the source file (MkDocs rewrites them for the built page)."""
    return posixpath.relpath(target_uri, posixpath.dirname(page.file.src_uri) or ".")


def _url(page, target_uri: str) -> str:
    """For raw HTML (never rewritten by MkDocs): relative to the built page's own URL."""
    return posixpath.relpath(target_uri, page.url.rstrip("/") or ".") if page.url else target_uri


def _evidence_card(page, proof_rel: str, test: str) -> str:
    doc = E.load(proof_rel, test)
    status = _status(doc, proof_rel)
    cmd = f"pytest '{proof_rel}::{test}'"
    if status != "current":
        why = {
            "missing": "no evidence has been recorded for this proof yet",
            "stale": "the proof or the shared model changed since this evidence was recorded",
            "failed": "the latest run of this proof FAILED",
        }[status]
        _problems.append(f"{page.file.src_uri}: evidence for {proof_rel}::{test} is {status}: {why}. Run `{cmd}`.")
        log.warning(_problems[-1])
        said = (doc or {}).get("failure", "") if status == "failed" else ""
        said = f" It said: `{said.splitlines()[0][:300]}`." if said else ""
        return (
            f'\n!!! failure "Evidence {status}: {test}"\n    {why.capitalize()}, so no numbers are shown.{said} '
            f"Run `{cmd}` (or `make proofs`) and rebuild.\n"
        )
    prov = doc["provenance"]
    claims = " ".join(f'<code>{c["id"]}</code> {_badge(c["verdict"])}' for c in doc["claims"])
    rows = "\n".join(
        f"<tr><td>{html.escape(m['name'])}</td><td class=\"num\">{html.escape(E.fmt(m['value']))}</td>"
        f"<td>{html.escape(m['expect'])}</td></tr>"
        for m in doc["measurements"]
    )
    figs = "".join(
        f'<figure><img src="{_url(page, _fig_uri(proof_rel, f["file"]))}" alt="{html.escape(f["caption"])}" loading="lazy">'
        f"<figcaption>{html.escape(f['caption'])}</figcaption></figure>"
        for f in doc["figures"]
    )
    return f"""
<div class="evidence" data-test="{test}" data-outcome="{doc['outcome']}">
<div class="evidence__head"><span class="evidence__pass">✔ passed</span> <code>{test}</code> {claims}</div>
<p class="evidence__doc">{html.escape(doc.get('doc', ''))}</p>
<table class="evidence__table"><thead><tr><th>measured</th><th>value</th><th>the claim predicts</th></tr></thead>
<tbody>
{rows}
</tbody></table>
{figs}
<details class="evidence__prov"><summary>Provenance: run {prov['date']}, seed {prov['seed']}, {prov['seconds']} s</summary>
<ul>
<li>date: {prov['date']}; torch {prov['torch']}; Python {prov['python']}; {prov['threads']} thread(s)</li>
<li>seed: {prov['seed']} (rerun with another: <code>--proof-seed N</code>)</li>
<li>run time: {prov['seconds']} s; code fingerprint <code>{prov['fingerprint']}</code> (matches the current proof)</li>
<li>reproduce: <code>{html.escape(prov['command'])}</code></li>
</ul>
</details>
</div>
"""


def _proof_tests(proofs: list[str]) -> dict[str, list[dict]]:
    """claim id -> evidence docs of tests (in the page's proofs) marked with it."""
    out: dict[str, list[dict]] = {}
    for proof_rel in proofs:
        for test, doc in E.load_all(proof_rel).items():
            doc["_status"] = _status(doc, proof_rel)
            for c in doc["claims"]:
                out.setdefault(c["id"], []).append(doc)
    return out


def _claims_table(page, meta: dict) -> str:
    by_claim = _proof_tests(meta.get("proofs", []))
    rows = []
    for cid, verdict in meta["claims"].items():
        docs = by_claim.get(cid, [])
        proof_cells = []
        for d in docs:
            ok = d["_status"] == "current"
            mark = "✔" if ok else f"⚠ {d['_status']}"
            name = html.escape(d["test"]).replace("_", "_<wbr>")  # a narrow column wraps the name between its words
            proof_cells.append(f'<a href="#evidence-{d["test"]}"><code>{name}</code></a> {mark}')
        rows.append(
            f'<tr><td><code>{cid}</code></td><td>{html.escape(_registry[cid]["claim"])}</td>'
            f"<td>{_badge(verdict)}</td><td>{'<br>'.join(proof_cells) or '—'}</td></tr>"
        )
    return (
        '<table class="claims"><thead><tr><th>claim</th><th>what is claimed</th><th>verdict</th><th>proof</th></tr>'
        "</thead><tbody>\n" + "\n".join(rows) + "\n</tbody></table>\n"
    )


def _ledger(page) -> str:
    settled: dict[str, list[tuple[str, dict]]] = {}  # claim id -> every page that settles it
    for uri, meta in _pages.items():
        for cid in meta["claims"]:
            settled.setdefault(cid, []).append((uri, meta))
    groups: dict[str, list[str]] = {}
    for cid, c in _registry.items():
        groups.setdefault(c["group"], []).append(cid)
    counts = {v: 0 for v in E.VERDICTS}
    out = []
    for group, ids in groups.items():
        title = AREA_TITLES.get(group, group.capitalize())
        out.append(f"\n### {title}\n\n| claim | what is claimed | verdict | page |\n|---|---|---|---|")
        for cid in ids:
            if cid in settled:
                verdict = settled[cid][0][1]["claims"][cid]  # one verdict per claim (the contract tests check)
                counts[verdict] += 1
                cell = _badge(verdict)
                link = "<br>".join(f"[{meta.get('title', uri)}]({_rel(page, uri)})" for uri, meta in settled[cid])
            else:
                cell, link = '<span class="verdict verdict--open">open</span>', "not yet settled"
            text = _registry[cid]["claim"].replace("|", "&#124;")  # a bare | would split the Markdown table's cell
            out.append(f"| `{cid}` | {text} | {cell} | {link} |")
    n_open = len(_registry) - sum(counts.values())
    head = (
        f"**{len(_registry)} claims**: {counts['confirmed']} confirmed, {counts['nuanced']} nuanced, "
        f"{counts['refuted']} refuted, {n_open} still open.\n"
    )
    return head + "\n".join(out) + "\n"


# ----------------------------------------------------------------------------------------------
# Study pages: built from the question pages themselves, so they cannot drift from them
# ----------------------------------------------------------------------------------------------



AREA_TITLES = {"attention": "Attention", "positions": "Embeddings and positions",
               "relative": "Relative positions and length", "normalisation": "Normalisation and residuals",
               "training": "Training", "cost": "Cost and complexity", "inference": "Attention at inference time",
               "blocks": "The modern block", "scale": "Numbers at scale",
               "generation": "Generating, tokenising, adapting", "post-training": "Post-training and reasoning",
               "beyond": "Beyond softmax attention", "real": "Against real implementations"}


MD_LINK = re.compile(r"\]\((?!https?:|#|/)([^)\s#]+\.md)(#[^)\s]*)?\)")
MD_PLAIN_LINK = re.compile(r"\[([^\]]+)\]\((?!https?:)[^)\s]+\)")  # a relative link -> its text (for Anki)


def _moved(text: str, from_uri: str, page) -> str:
    """Rewrite relative .md links of text written in from_uri so they work inside `page`; a bare `#anchor` (a
    push-back pointing at a section of its own page) becomes a link to that section of from_uri."""
    def fix(m: re.Match) -> str:
        target = posixpath.normpath(posixpath.join(posixpath.dirname(from_uri), m[1]))
        return f"]({_rel(page, target)}{m[2] or ''})"

    text = re.sub(r"\]\((#[^)\s]+)\)", lambda m: f"]({posixpath.basename(from_uri)}{m[1]})", text)
    return MD_LINK.sub(fix, text)


def _render_values(markdown: str, where: str, proofs: list[str]) -> str:
    """Replace every `<!-- value: test / name -->` with the measured value from that page's proofs."""

    def value(m: re.Match) -> str:
        proof_rel = m["proof"] or proofs[0]
        doc = E.load(proof_rel, m["test"])
        status = _status(doc, proof_rel)
        found = [x for x in (doc or {}).get("measurements", []) if x["name"] == m["name"]]
        if status != "current" or not found:
            why = status if status != "current" else f"no measurement named {m['name']!r}"
            _problems.append(f"{where}: inline value {m['test']} / {m['name']} is unavailable ({why}).")
            log.warning(_problems[-1])
            return f'<span class="value value--missing">[{why}]</span>'
        return f'<span class="value" title="measured by {m["test"]}">{html.escape(E.fmt(found[0]["value"]))}</span>'

    out = VALUE_MARK.sub(value, markdown)
    for line in out.splitlines():  # a marker the pattern could not read would otherwise stay as an HTML comment
        if re.search(r"<!--\s*value:", line) and "`" not in line:
            _problems.append(f"{where}: a value marker could not be read (write <!-- value: test / name -->): {line.strip()}")
            log.warning(_problems[-1])
    return out


def _evidence_links(text: str, from_uri: str) -> str:
    """Evidence cards stay on their question page: in a copied block each `<!-- evidence: test -->` becomes a
    link to that card (an unfilled marker would otherwise be left as an HTML comment)."""
    own = posixpath.basename(from_uri)
    return EVIDENCE_MARK.sub(lambda m: f"([the measurement, on the page]({own}#evidence-{m['test']}))", text)


INLINE_MATH = re.compile(r"(?<![\\$])\$(?!\$)([^$\n]+?)(?<!\\)\$(?!\$)")


def _math_lt(text: str) -> str:
    """`<` inside inline math as `\\lt`: on a question page arithmatex shields `$n_{kv}<p$`, but in a copied block
    (the flashcards' nested `markdown` divs) the HTML parser reads `<p` as a tag and swallows the rest of the deck."""
    return INLINE_MATH.sub(lambda m: "$" + re.sub(r"<(?!!--)", r"\\lt ", m[1]) + "$", text)


def _copied(text: str, from_uri: str, page) -> str:
    """A block of question page `from_uri` shown on `page`: its links rewritten, its measured values filled in."""
    text = _math_lt(_evidence_links(text, from_uri))
    return _render_values(_moved(text, from_uri, page), from_uri, _pages[from_uri].get("proofs") or [])


def _seed_report(page) -> str:
    """bench/seeds/**.json (written by `python -m proofs.seeds --record`): each test's pass rate over many seeds
    and the spread of what it measured, marked stale when the proof changed after the sweep."""
    reports = sorted((ROOT / "bench" / "seeds").rglob("*.json"))
    if not reports:
        return "*No seed sweep has been recorded yet: run `python -m proofs.seeds <proof> --record`.*\n"
    out = []
    for path in reports:
        rep = json.loads(path.read_text(encoding="utf-8"))
        proof = rep["proof"]
        current = (ROOT / proof).exists() and _fingerprint(proof)
        out.append(f"\n### `{proof}`\n\n| test | seeds | passed | s / seed | recorded | code |\n|---|---|---|---|---|---|")
        details = []
        for test, t in sorted(rep["tests"].items()):
            fresh = "current" if t["fingerprint"] == current else "changed since"
            out.append(f"| `{test}` | {t['seeds']} | {t['passed']} | {t['seconds']:.2f} | {t['date']} | {fresh} |")
            rows = "\n".join(f"    | {html.escape(name)} | {E.fmt(m['mean'])} | {E.fmt(m['sd'])} | {E.fmt(m['min'])} | "
                             f"{E.fmt(m['max'])} | {m['n']} |" for name, m in t["measurements"].items())
            if rows:
                details.append(f'??? note "Spread of what `{test}` measured ({t["seeds"]} seeds)"\n'
                               f"    | measurement | mean | sd | min | max | values |\n    |---|---|---|---|---|---|\n{rows}\n")
        out.append("\n" + "\n".join(details))
    return "\n".join(out) + "\n"


def _verdicts(page):
    return lambda q: ", ".join(f"<code>{c}</code> {_badge(v)}" for c, v in q.claims.items())


def _study(markdown: str, page) -> str:
    """The study pages' markers: cheat sheet, flashcards, mock interview."""
    link = lambda uri: _rel(page, uri)  # noqa: E731
    copied = lambda text, uri: _copied(text, uri, page)  # noqa: E731
    if "<!-- cheatsheet -->" in markdown:
        pdf = _url(page, _built["pdf"]) if "pdf" in _built else None
        markdown = markdown.replace("<!-- cheatsheet -->", study.cheatsheet(_questions, link, copied, _verdicts(page), pdf))
    if "<!-- flashcards -->" in markdown:
        deck = study.deck(_questions, link, copied, _verdicts(page), "cards")
        anki = (f'<p><a class="md-button" href="{_url(page, _built["anki"])}" download>Download the Anki deck</a></p>\n\n'
                if "anki" in _built else "")
        markdown = markdown.replace("<!-- flashcards -->", anki + deck)
    if "<!-- seed-report -->" in markdown:
        markdown = markdown.replace("<!-- seed-report -->", _seed_report(page))
    if "<!-- mock-interview -->" in markdown:
        markdown = markdown.replace("<!-- mock-interview -->", study.deck(_questions, link, copied, _verdicts(page), "mock"))
    return markdown


THIRTY_PAIR = re.compile(r'(^!!! abstract "The 30-second answer"\n(?:    .*\n|[ \t]*\n)+)(^!!! abstract "30 秒回答"\n(?:    .*\n|[ \t]*\n)+)', re.M)


def on_page_markdown(markdown: str, page, config, files):
    meta = page.meta
    if "<!-- ledger -->" in markdown:
        markdown = markdown.replace("<!-- ledger -->", _ledger(page))
    markdown = _study(markdown, page)
    try:
        markdown = scale_box.render(markdown, lambda uri: _rel(page, uri))
    except ValueError as e:
        raise PluginError(f"{page.file.src_uri}: {e}") from e
    if not meta.get("claims"):
        return markdown
    where = page.file.src_uri
    unknown = [c for c in meta["claims"] if c not in _registry]
    if unknown:
        raise PluginError(f"{where}: unknown claim id(s) {unknown}; add them to proofs/claims.yml or fix the typo.")
    bad = {c: v for c, v in meta["claims"].items() if v not in E.VERDICTS}
    if bad:
        raise PluginError(f"{where}: verdicts must be one of {E.VERDICTS}, got {bad}.")
    proofs = meta.get("proofs") or []
    missing = [p for p in proofs if not (ROOT / p).is_file()]
    if missing or not proofs:
        raise PluginError(f"{where}: front matter `proofs:` must list existing proof files; missing {missing or 'all'}.")

    box = study.run_box(where, proofs, _drills.get(where, []), lambda uri: _url(page, uri))
    markdown = markdown.replace("<!-- claims -->", _claims_table(page, meta) + box)
    # English and Chinese 30-second answers side by side (stacked on narrow screens)
    markdown = THIRTY_PAIR.sub(lambda m: f'<div class="thirty-pair" markdown>\n\n{m[1]}\n{m[2]}\n</div>\n', markdown)

    def card(m: re.Match) -> str:
        proof_rel = m["proof"] or proofs[0]
        if proof_rel not in proofs:
            raise PluginError(f"{where}: evidence marker names {proof_rel}, which is not in the page's `proofs:`.")
        return f'<a id="evidence-{m["test"]}"></a>\n' + _evidence_card(page, proof_rel, m["test"])

    markdown = _render_values(markdown, where, proofs)
    return EVIDENCE_MARK.sub(card, markdown)


def on_post_build(config):
    # --strict counts warnings only when they are logged (`mkdocs build -q` hides them): fail here as well.
    if config.get("strict") and _problems:
        raise PluginError(f"{len(_problems)} evidence problem(s); run the proofs (`make proofs`):\n" + "\n".join(_problems))


def on_page_content(html: str, page, config, files):
    """Chinese answer boxes carry lang="zh" (fonts, screen readers, the study tests' locator)."""
    return re.sub(r'<(div|details) class="([^"]*)">(\s*<(?:p class="admonition-title"|summary)>(?:30 秒回答|如果面试官追问)<)',
                  r'<\1 class="\2" lang="zh">\3', html)
