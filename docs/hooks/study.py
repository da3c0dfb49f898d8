"""Study material built from the question pages themselves, so it cannot drift from them.

Imported by the `evidence` hook (not a hook itself). Everything here reads the question pages' front
matter and Markdown: a new page joins the cheat sheet, the flashcards, the mock interview, the Anki deck,
the tags and the notebook downloads without any hand edit.

    Question        one question page: titles (en, zh), area, difficulty, 30-second answers, push-back boxes
                    ("If they push back" / "如果面试官追问"), follow-ups, common wrong answers, proofs
    cheatsheet()    every 30-second answer with its verdicts, one section per area (a page break each in print);
                    no push-back: the sheet stays a crisp one-pass review
    deck()          the cards (a page's question, then each follow-up) as hidden blocks for docs/javascripts/study.js,
                    which runs the flashcards (Leitner boxes in localStorage) and the mock interview; a question's
                    back is its 30-second answer, its push-back is a separate block one key (p) away
    anki_deck()     the same cards as an .apkg (genanki); the push-back is a labelled part below the answer
    notebooks()     every proof as an .ipynb (jupytext), for download
    run_box()       the "Run it yourself" box of a page: commands, notebook, coding drills
"""

from __future__ import annotations

import hashlib
import json
import html
import posixpath
import re
from dataclasses import dataclass, field
from pathlib import Path

THIRTY_EN = re.compile(r'^!!! abstract "The 30-second answer"\n((?:    .*\n|[ \t]*\n)+)', re.M)
THIRTY_ZH = re.compile(r'^!!! abstract "30 秒回答"\n((?:    .*\n|[ \t]*\n)+)', re.M)
# The push-back boxes under the 30-second answers: `??? tip "If they push back"`, each probe a paragraph that opens
# with the bold question, `**"…?"** answer` (Chinese: `**"……？"** ……`, straight or curly quotes).
PUSHBACK_EN = re.compile(r'^\?\?\?\+? tip "If they push back"\n((?:    .*\n|[ \t]*\n)+)', re.M)
PUSHBACK_ZH = re.compile(r'^\?\?\?\+? tip "如果面试官追问"\n((?:    .*\n|[ \t]*\n)+)', re.M)
# a probe's bold question at a line start of the dedented box; it may wrap, but not across a blank line
PROBE = re.compile(r'^\*\*["“「]?(?:(?!\*\*|\n[ \t]*\n).)+?[?？]["”」]?\*\*', re.M | re.S)
FOLLOW_UP = re.compile(r'^\?\?\? question "(?P<q>[^"]+)"\n(?P<a>(?:    .*\n|[ \t]*\n)+)', re.M)
WRONG = re.compile(r"^## Common wrong answers[^\n]*\n(?P<body>.*?)(?=^## |\Z)", re.M | re.S)
DRILL_PAGE = re.compile(r'^PAGE\s*=\s*"([^"]+)"', re.M)
DIFFICULTIES = ("easy", "medium", "hard")


def dedent(block: str) -> str:
    """An admonition's body without its 4-space indent and without the wrapping <div> lines."""
    lines = [ln[4:] if ln.startswith("    ") else ln.strip() for ln in block.rstrip().splitlines()]
    return "\n".join(ln for ln in lines if not ln.startswith("<div") and ln != "</div>").strip()


@dataclass
class Question:
    uri: str  # docs-relative path of the page, e.g. attention/masks.md
    title: str
    title_zh: str
    area: str  # first folder of uri: attention, inference, ...
    area_title: str
    difficulty: str
    asked_often: bool
    answer_en: str  # Markdown of the 30-second answer
    answer_zh: str
    pushback_en: str = ""  # Markdown of the "If they push back" box ("" when the page has none yet)
    pushback_zh: str = ""  # Markdown of the "如果面试官追问" box
    follow_ups: list[tuple[str, str]] = field(default_factory=list)  # (question, answer Markdown)
    wrong: str = ""  # Markdown of the "Common wrong answers" section
    claims: dict = field(default_factory=dict)
    proofs: list = field(default_factory=list)


def question(uri: str, meta: dict, body: str, area_titles: dict) -> Question:
    en, zh, wrong = THIRTY_EN.search(body), THIRTY_ZH.search(body), WRONG.search(body)
    pb_en, pb_zh = PUSHBACK_EN.search(body), PUSHBACK_ZH.search(body)
    area = uri.split("/")[0]
    return Question(
        uri=uri, title=meta.get("title", uri), title_zh=meta.get("title_zh", ""), area=area,
        area_title=area_titles.get(area, area.capitalize()), difficulty=meta.get("difficulty", ""),
        asked_often=bool(meta.get("asked_often")), answer_en=dedent(en[1]) if en else "",
        answer_zh=dedent(zh[1]) if zh else "", pushback_en=dedent(pb_en[1]) if pb_en else "",
        pushback_zh=dedent(pb_zh[1]) if pb_zh else "", follow_ups=[(m["q"], dedent(m["a"])) for m in FOLLOW_UP.finditer(body)],
        wrong=wrong["body"].strip() if wrong else "", claims=meta.get("claims", {}), proofs=meta.get("proofs", []),
    )


def nav_order(nav) -> list[str]:
    """Every page path of mkdocs.yml's nav, in order."""
    out: list[str] = []

    def walk(item):
        if isinstance(item, str):
            out.append(item)
        elif isinstance(item, dict):
            for v in item.values():
                walk(v)
        elif isinstance(item, list):
            for v in item:
                walk(v)

    walk(nav or [])
    return out


def in_nav_order(questions: list[Question], nav: list[str]) -> list[Question]:
    rank = {uri: i for i, uri in enumerate(nav)}
    return sorted(questions, key=lambda q: (rank.get(q.uri, len(rank)), q.uri))


def by_area(questions: list[Question]) -> dict[str, list[Question]]:
    areas: dict[str, list[Question]] = {}
    for q in questions:
        areas.setdefault(q.area, []).append(q)
    return areas


def probes(pushback: str) -> list[str]:
    """The bold questions of a push-back box's Markdown (dedented), in order."""
    return PROBE.findall(pushback)


def card_id(uri: str, follow_up: str | None = None) -> str:
    return uri if follow_up is None else f"{uri}#{hashlib.sha1(follow_up.encode()).hexdigest()[:8]}"


def tags_of(meta: dict, area_title: str) -> list[str]:
    """The tags a question page gets on top of its own: its area, its difficulty, "asked often"."""
    extra = [area_title]
    if meta.get("difficulty") in DIFFICULTIES:
        extra.append(f"difficulty: {meta['difficulty']}")
    if meta.get("asked_often"):
        extra.append("asked often")
    return extra


def badges(q: Question) -> str:
    out = [f'<span class="kb-badge kb-badge--{q.difficulty}">{q.difficulty}</span>'] if q.difficulty else []
    if q.asked_often:
        out.append('<span class="kb-badge kb-badge--often">asked often</span>')
    return " ".join(out)


# ----------------------------------------------------------------------------------------------
# Cheat sheet
# ----------------------------------------------------------------------------------------------

def cheatsheet(questions: list[Question], link, copied, verdicts, pdf: str | None) -> str:
    """link(uri) -> relative link; copied(text, uri) -> text with links and values fixed; verdicts(q) -> HTML."""
    out = []
    if pdf:
        out.append(f'<p class="kb-pdf"><a class="md-button" href="{pdf}" download>Download the cheat sheet as a PDF</a></p>\n')
    for area, qs in by_area(questions).items():
        out.append(f'<div class="cheat-area" markdown>\n\n## {qs[0].area_title}\n')
        for q in qs:
            zh = f" · {q.title_zh}" if q.title_zh else ""
            out.append(f"### [{q.title}]({link(q.uri)}){zh}\n\n{badges(q)}\n")
            out.append((copied(q.answer_en, q.uri) or "*(no 30-second answer yet)*") + "\n")
            out.append(f'<p class="cheat__verdicts">{verdicts(q)}</p>\n')
            if q.answer_zh:
                body = "\n".join("    " + ln if ln.strip() else "" for ln in copied(q.answer_zh, q.uri).splitlines())
                out.append(f'??? note "中文"\n{body}\n')
        out.append("</div>\n")
    return "\n".join(out)


# ----------------------------------------------------------------------------------------------
# Cards: flashcards and the mock interview read the same hidden blocks
# ----------------------------------------------------------------------------------------------

def _block(cls: str, markdown: str, lang: str = "") -> str:
    lang_attr = f' lang="{lang}"' if lang else ""
    return f'<div class="{cls}"{lang_attr} markdown>\n\n{markdown}\n\n</div>'


def deck(questions: list[Question], link, copied, verdicts, mode: str) -> str:
    """The app container plus one hidden block per card; study.js turns them into flashcards or a mock interview."""
    areas = {q.area: q.area_title for q in questions}
    options = "".join(f'<option value="{a}">{html.escape(t)}</option>' for a, t in areas.items())
    cards = []
    for q in questions:
        see = f"[Derivation and proof: {q.title}]({link(q.uri)})"
        zh_see = f"[推导与证明：{q.title_zh or q.title}]({link(q.uri)})"
        parts = [
            _block("kb-card__front", f"**{q.title}**"),
            _block("kb-card__back", f"{copied(q.answer_en, q.uri)}\n\n{verdicts(q)}\n\n{see}"),
        ]
        if q.pushback_en:  # shown below the back by the "If they push back" button (key p)
            parts.append(_block("kb-card__push", f'<p class="kb-label">If they push back</p>\n\n{copied(q.pushback_en, q.uri)}'))
        if q.title_zh and q.answer_zh:
            parts += [_block("kb-card__front-zh", f"**{q.title_zh}**", "zh"),
                      _block("kb-card__back-zh", f"{copied(q.answer_zh, q.uri)}\n\n{verdicts(q)}\n\n{zh_see}", "zh")]
            if q.pushback_zh:
                parts.append(_block("kb-card__push-zh",
                                    f'<p class="kb-label">如果面试官追问</p>\n\n{copied(q.pushback_zh, q.uri)}', "zh"))
        if q.wrong:  # the mock interview's second step, with the push-back
            parts.append(_block("kb-card__wrong", f'<p class="kb-label">Common wrong answers</p>\n\n{copied(q.wrong, q.uri)}'))
        cards.append(f'<div class="kb-card" data-id="{html.escape(card_id(q.uri))}" data-area="{q.area}" '
                     f'data-kind="question" data-difficulty="{q.difficulty}" markdown>\n\n' + "\n\n".join(parts) + "\n\n</div>")
        if mode == "mock":
            continue  # the mock interview asks the pages' questions; follow-ups are for the cards
        for fq, fa in q.follow_ups:
            parts = [_block("kb-card__front", f"**{fq}**\n\n<small>Follow-up to: {html.escape(q.title)}</small>"),
                     _block("kb-card__back", f"{copied(fa, q.uri)}\n\n{see}")]
            cards.append(f'<div class="kb-card" data-id="{html.escape(card_id(q.uri, fq))}" data-area="{q.area}" '
                         f'data-kind="follow-up" markdown>\n\n' + "\n\n".join(parts) + "\n\n</div>")
    app = (f'<div class="kb-app" data-mode="{mode}" data-cards="{len(cards)}">\n'
           f'<select class="kb-areas" aria-label="deck">'
           f'<option value="all">{"All areas" if mode == "cards" else "All areas"}</option>{options}</select>\n'
           f'<noscript>This page needs JavaScript; the same answers are on the cheat sheet.</noscript>\n</div>\n')
    return app + '\n<div class="kb-deck" markdown>\n\n' + "\n\n".join(cards) + "\n\n</div>\n"


# ----------------------------------------------------------------------------------------------
# Anki deck
# ----------------------------------------------------------------------------------------------

ANKI_MODEL_ID, ANKI_DECK_ID = 1607392319, 2059400110  # fixed: re-imports update the same deck


def anki_verdicts(q: Question) -> str:
    """The claims and verdicts of a question as plain HTML (Anki has not the site's stylesheet)."""
    icon = {"confirmed": "✅", "nuanced": "⚖️", "refuted": "❌"}
    return " · ".join(f"<code>{html.escape(c)}</code> {icon.get(v, '')} {html.escape(str(v))}" for c, v in q.claims.items())


def anki_deck(questions: list[Question], copied_plain, out: Path, site_url: str | None = None) -> int:
    """Write the cards as an Anki package; returns the number of notes. Math stays \\( \\) for Anki's MathJax.

    A question's Back holds its 30-second answers (English, then Chinese) and its verdicts; the push-back boxes
    follow in a separate part under their own heading, so the answer itself stays short. The note type keeps its
    three fields (a changed field list would clash with decks already imported). Page names the question page,
    as a link when mkdocs.yml has a site_url."""
    import genanki
    import markdown as md

    to_html = lambda text: md.markdown(  # noqa: E731
        text, extensions=["tables", "pymdownx.arithmatex"], extension_configs={"pymdownx.arithmatex": {"generic": True}})
    model = genanki.Model(
        ANKI_MODEL_ID, "Transformer answers you can run",
        fields=[{"name": "Front"}, {"name": "Back"}, {"name": "Page"}],
        templates=[{"name": "Card", "qfmt": "{{Front}}",
                    "afmt": "{{FrontSide}}<hr id=answer>{{Back}}<p style='font-size:small'>{{Page}}</p>"}],
    )
    deck_ = genanki.Deck(ANKI_DECK_ID, "Transformer answers you can run")
    n = 0
    for q in questions:
        if site_url:
            href = html.escape(site_url.rstrip("/") + "/" + q.uri.removesuffix(".md") + "/")
            page = f'Derivation and proof: <a href="{href}">{html.escape(q.title)}</a> (docs/{q.uri})'
        else:
            page = f"Derivation and proof: docs/{q.uri}"
        front = f"<b>{html.escape(q.title)}</b>" + (f"<br>{html.escape(q.title_zh)}" if q.title_zh else "")
        back = to_html(copied_plain(q.answer_en, q.uri)) + (
            "<hr>" + to_html(copied_plain(q.answer_zh, q.uri)) if q.answer_zh else "")
        back += f"<p style='font-size:small'>{anki_verdicts(q)}</p>"
        push = [(label, text) for label, text in (("If they push back", q.pushback_en), ("如果面试官追问", q.pushback_zh))
                if text]
        if push:
            back += "<div class='pushback' style='border-top:2px dashed #999;margin-top:1em;font-size:90%'>" + "".join(
                f"<h4>{label}</h4>{to_html(copied_plain(text, q.uri))}" for label, text in push) + "</div>"
        deck_.add_note(genanki.Note(model=model, fields=[front, back, page], guid=genanki.guid_for(card_id(q.uri)),
                                    tags=[q.area]))
        n += 1
        for fq, fa in q.follow_ups:
            deck_.add_note(genanki.Note(model=model, fields=[html.escape(fq), to_html(copied_plain(fa, q.uri)), page],
                                        guid=genanki.guid_for(card_id(q.uri, fq)), tags=[q.area, "follow-up"]))
            n += 1
    out.parent.mkdir(parents=True, exist_ok=True)
    genanki.Package(deck_).write_to_file(str(out))
    return n


# ----------------------------------------------------------------------------------------------
# Notebooks and the "Run it yourself" box
# ----------------------------------------------------------------------------------------------

def notebook_uri(proof_rel: str) -> str:
    """proofs/attention/proof_masks.py -> notebooks/attention/proof_masks.ipynb"""
    return "notebooks/" + proof_rel.removeprefix("proofs/").removesuffix(".py") + ".ipynb"


def notebooks(root: Path, out: Path) -> dict[str, Path]:
    """Every proof file as a notebook (jupytext percent -> ipynb, with a python3 kernelspec): uri -> file.

    A notebook is converted again only when its proof's bytes or jupytext's version changed since the last build
    (out/notebooks/sources.json keeps a hash of both per proof): converting all of them took a few seconds a build."""
    import jupytext

    index = out / "notebooks" / "sources.json"
    known = json.loads(index.read_text(encoding="utf-8")) if index.exists() else {}
    made, seen = {}, {}
    for proof in sorted((root / "proofs").rglob("proof_*.py")):
        rel = proof.relative_to(root).as_posix()
        target = out / notebook_uri(rel)
        key = hashlib.sha256(proof.read_bytes() + jupytext.__version__.encode()).hexdigest()
        if known.get(rel) != key or not target.exists():
            nb = jupytext.read(proof, fmt="py:percent")
            nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
            nb.metadata.setdefault("jupytext", {})["source"] = rel
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(jupytext.writes(nb, fmt="ipynb"), encoding="utf-8")
        seen[rel] = key
        made[notebook_uri(rel)] = target
    if seen != known:
        index.parent.mkdir(parents=True, exist_ok=True)
        index.write_text(json.dumps(seen, indent=0, sort_keys=True), encoding="utf-8")
    return made


def drills(root: Path) -> dict[str, list[str]]:
    """page uri -> drill files (proofs/drills/drill_*.py declare PAGE = "area/page.md")."""
    out: dict[str, list[str]] = {}
    for path in sorted((root / "proofs" / "drills").glob("drill_*.py")):
        m = DRILL_PAGE.search(path.read_text(encoding="utf-8"))
        if m:
            out.setdefault(m[1], []).append(path.relative_to(root).as_posix())
    return out


def run_box(uri: str, proofs: list[str], page_drills: list[str], url) -> str:
    """The admonition under a page's claims table: how to rerun its proofs, open them, drill them."""
    lines = [f"pytest {p}" for p in proofs]
    lines += [f"pytest {proofs[0]} --proof-seed 12345   # any other seed", f"jupytext --to notebook {proofs[0]}"]
    lines += [f"pytest {d}   # coding drill: implement it, the test checks it" for d in page_drills]
    code = "\n".join("    " + ln for ln in lines)
    nbs = " · ".join(f'<a href="{url(notebook_uri(p))}" download>{posixpath.basename(notebook_uri(p))}</a>'
                     for p in proofs)
    return (f'\n!!! tip "Run it yourself"\n    From the repository root (`make test` sets everything up):\n\n'
            f"    ```bash\n{code}\n    ```\n\n    Download the proof as a notebook: {nbs}\n")
