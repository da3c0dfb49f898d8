"""No page marker is left unfilled wherever a page's text is shown: the built HTML (question pages, and the
flashcards, mock interview and cheat sheet that copy their answers and follow-ups) and the Anki deck's notes."""

from __future__ import annotations

import re
import sqlite3
import zipfile

MARKER = re.compile(r"<!--\s*(evidence|value|claims|cheatsheet|flashcards|mock-interview|seed-report|ledger)\b[^>]*-->")


def test_no_unfilled_marker_in_the_built_site(site):
    left = [f"{p.relative_to(site)}: {m.group(0)}" for p in sorted(site.rglob("*.html"))
            for m in MARKER.finditer(p.read_text(encoding="utf-8"))]
    assert not left, "markers left unfilled (a copied block must fill or link them):\n" + "\n".join(left[:20])


def test_study_pages_link_evidence_cards_back_to_their_page(site):
    """A follow-up whose answer holds an evidence card shows, on the flashcards, a link to that card."""
    cards = (site / "study" / "flashcards" / "index.html").read_text(encoding="utf-8")
    assert re.search(r'href="[^"]*relative/rpr/#evidence-test_cost_of_relative_terms"', cards)


def test_no_unfilled_marker_in_the_anki_deck(site, tmp_path):
    with zipfile.ZipFile(site / "study" / "transformer-proofs.apkg") as z:
        z.extract("collection.anki2", tmp_path)
    with sqlite3.connect(tmp_path / "collection.anki2") as db:
        notes = [row[0] for row in db.execute("select flds from notes")]
    assert notes, "the Anki deck has no notes"
    left = [m.group(0) for n in notes for m in MARKER.finditer(n)]
    assert not left, f"{len(left)} Anki notes keep an unfilled marker, e.g. {left[:3]}"


def test_every_card_of_the_deck_is_rendered(site):
    """The flashcards and mock interview render every card they count: one stray `<` in a copied answer (e.g.
    `$n<p$`, read as a `<p` tag inside the nested `markdown` divs) once swallowed the deck from that card on."""
    for page in ("flashcards", "mock-interview"):
        text = (site / "study" / page / "index.html").read_text(encoding="utf-8")
        counted = int(re.search(r'data-cards="(\d+)"', text)[1])
        assert text.count('class="kb-card"') == counted > 50, page
