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
import logging
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

log = logging.getLogger("mkdocs.hooks.evidence")
KATEX_DIST = ROOT / "build" / "npm" / "node_modules" / "katex" / "dist"
KATEX_FILES = ["katex.min.js", "katex.min.css", "contrib/auto-render.min.js"]
EVIDENCE_MARK = re.compile(r"<!--\s*evidence:\s*(?:(?P<proof>[\w./-]+\.py)::)?(?P<test>\w+)\s*-->")
VALUE_MARK = re.compile(r"<!--\s*value:\s*(?:(?P<proof>[\w./-]+\.py)::)?(?P<test>\w+)\s*/\s*(?P<name>[^>]+?)\s*-->")
VERDICT_ICON = {"confirmed": "✅", "nuanced": "⚖️", "refuted": "❌"}

_registry: dict[str, dict] = {}
_pages: dict[str, dict] = {}  # src_uri -> front matter of every question page
_bodies: dict[str, str] = {}  # src_uri -> Markdown body of every question page (for the study pages)
_problems: list[str] = []  # evidence that could not be shown as current, reported again after the build


def _fig_uri(proof_rel: str, file: str) -> str:
    return f"evidence/{proof_rel.removeprefix('proofs/').removesuffix('.py')}/{file}"


def on_config(config):
    global _registry
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
    return files


# ----------------------------------------------------------------------------------------------
# Rendering
# ----------------------------------------------------------------------------------------------


def _badge(verdict: str) -> str:
    return f'<span class="verdict verdict--{verdict}">{VERDICT_ICON[verdict]} {verdict}</span>'


def _status(doc: dict | None, proof_rel: str) -> str:
    """'current', 'missing', 'stale' or 'failed'."""
    if doc is None:
        return "missing"
    if doc["provenance"]["fingerprint"] != E.fingerprint(ROOT / proof_rel):
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
            proof_cells.append(f'<a href="#evidence-{d["test"]}"><code>{d["test"]}</code></a> {mark}')
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
            out.append(f"| `{cid}` | {_registry[cid]['claim'].replace('|', '/')} | {cell} | {link} |")
    n_open = len(_registry) - sum(counts.values())
    head = (
        f"**{len(_registry)} claims**: {counts['confirmed']} confirmed, {counts['nuanced']} nuanced, "
        f"{counts['refuted']} refuted, {n_open} still open.\n"
    )
    return head + "\n".join(out) + "\n"


# ----------------------------------------------------------------------------------------------
# Study pages: built from the question pages themselves, so they cannot drift from them
# ----------------------------------------------------------------------------------------------

THIRTY = re.compile(r'^!!! abstract "The 30-second answer"\n((?:    .*\n|\s*\n)+)', re.M)
FOLLOW_UP = re.compile(r'^\?\?\? question "(?P<q>[^"]+)"\n(?P<a>(?:    .*\n|[ \t]*\n)+)', re.M)


AREA_TITLES = {"attention": "Attention", "positions": "Embeddings and positions",
               "relative": "Relative positions and length", "normalisation": "Normalisation and residuals",
               "training": "Training", "cost": "Cost and complexity", "inference": "Attention at inference time",
               "blocks": "The modern block", "scale": "Numbers at scale",
               "generation": "Generating, tokenising, adapting"}


def _by_area() -> dict[str, list[str]]:
    areas: dict[str, list[str]] = {}
    for uri in sorted(_pages):
        areas.setdefault(uri.split("/")[0], []).append(uri)
    return areas


def _dedent(block: str) -> str:
    lines = [ln[4:] if ln.startswith("    ") else ln.strip() for ln in block.rstrip().splitlines()]
    return "\n".join(ln for ln in lines if not ln.startswith("<div") and ln != "</div>").strip()


MD_LINK = re.compile(r"\]\((?!https?:|#|/)([^)\s#]+\.md)(#[^)\s]*)?\)")


def _moved(text: str, from_uri: str, page) -> str:
    """Rewrite relative .md links of text written in from_uri so they work inside `page`."""
    def fix(m: re.Match) -> str:
        target = posixpath.normpath(posixpath.join(posixpath.dirname(from_uri), m[1]))
        return f"]({_rel(page, target)}{m[2] or ''})"

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

    return VALUE_MARK.sub(value, markdown)


def _copied(text: str, from_uri: str, page) -> str:
    """A block of question page `from_uri` shown on `page`: its links rewritten, its measured values filled in."""
    return _render_values(_moved(text, from_uri, page), from_uri, _pages[from_uri].get("proofs") or [])


def _cheatsheet(page) -> str:
    out = []
    for area, uris in _by_area().items():
        out.append(f"\n## {AREA_TITLES.get(area, area.capitalize())}\n")
        for uri in uris:
            meta, m = _pages[uri], THIRTY.search(_bodies[uri])
            verdicts = ", ".join(f"<code>{c}</code> {_badge(v)}" for c, v in meta["claims"].items())
            out.append(f"### [{meta.get('title', uri)}]({_rel(page, uri)})\n")
            out.append((_copied(_dedent(m[1]), uri, page) if m else "*(this page has no 30-second answer yet)*") + "\n")
            out.append(f'<p class="cheat__verdicts">{verdicts}</p>\n')
    return "\n".join(out)


def _flashcards(page) -> str:
    out = []
    for area, uris in _by_area().items():
        out.append(f"\n## {AREA_TITLES.get(area, area.capitalize())}\n")
        for uri in uris:
            title = _pages[uri].get("title", uri)
            for m in FOLLOW_UP.finditer(_bodies[uri]):
                answer = "\n".join("    " + ln if ln.strip() else "" for ln in _copied(_dedent(m["a"]), uri, page).splitlines())
                out.append(f'??? question "{m["q"]}"\n{answer}\n\n    *From [{title}]({_rel(page, uri)}).*\n')
    return "\n".join(out)


def on_page_markdown(markdown: str, page, config, files):
    meta = page.meta
    if "<!-- ledger -->" in markdown:
        markdown = markdown.replace("<!-- ledger -->", _ledger(page))
    if "<!-- cheatsheet -->" in markdown:
        markdown = markdown.replace("<!-- cheatsheet -->", _cheatsheet(page))
    if "<!-- flashcards -->" in markdown:
        markdown = markdown.replace("<!-- flashcards -->", _flashcards(page))
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

    markdown = markdown.replace("<!-- claims -->", _claims_table(page, meta))

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
