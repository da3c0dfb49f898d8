"""The claims contract: every page's claims exist, its proofs exist, and each verdict is backed by a
passing, current proof test marked with that claim id and verdict.

Run after the proofs (they write evidence/); `make test` does both in order.
"""

from __future__ import annotations

import ast
import functools

import pytest

from proofs import evidence as E
from tests.pages import ROOT, question_pages, registry

PAGES = question_pages()


@functools.cache  # a proof file is read once per session, not once per claim of every page that lists it
def marked_claims(proof: str) -> frozenset[tuple[str, str, str]]:
    """(test name, claim id, verdict) for every @pytest.mark.claim in a proof file, read from its source."""
    out = set()
    tree = ast.parse((ROOT / proof).read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef):
            for dec in node.decorator_list:
                if isinstance(dec, ast.Call) and getattr(dec.func, "attr", "") == "claim":
                    out.add((node.name, dec.args[0].value, dec.args[1].value))
    return frozenset(out)


fingerprint = functools.cache(E.fingerprint)  # the code does not change during a test session


def test_there_are_question_pages():
    assert len(PAGES) >= 3


@pytest.mark.parametrize("page", sorted(PAGES))
def test_page_names_known_claims_and_existing_proofs(page):
    meta, reg = PAGES[page], registry()
    unknown = sorted(set(meta["claims"]) - set(reg))
    assert not unknown, f"{page}: unknown claim ids {unknown} (add them to proofs/claims.yml)"
    bad = {c: v for c, v in meta["claims"].items() if v not in E.VERDICTS}
    assert not bad, f"{page}: verdicts must be one of {E.VERDICTS}: {bad}"
    assert meta.get("proofs"), f"{page}: front matter lists no proofs"
    for proof in meta["proofs"]:
        assert (ROOT / proof).is_file(), f"{page}: proof file {proof} does not exist"


@pytest.mark.parametrize("page", sorted(PAGES))
def test_every_verdict_is_backed_by_a_passing_current_proof(page, evidence_ready):
    meta = PAGES[page]
    for cid, verdict in meta["claims"].items():
        backing = [(p, t) for p in meta["proofs"] for t, c, v in marked_claims(p) if (c, v) == (cid, verdict)]
        assert backing, f"{page}: no test in {meta['proofs']} is marked claim({cid!r}, {verdict!r})"
        ok = []
        for proof, test in backing:
            doc = E.load(proof, test)
            assert doc is not None, f"no evidence for {proof}::{test}: run the proofs first (`make proofs`)"
            assert doc["provenance"]["fingerprint"] == fingerprint(ROOT / proof), (
                f"evidence for {proof}::{test} is stale: rerun the proof")
            ok.append(doc["outcome"] == "passed")
        assert any(ok), f"{page}: {cid} {verdict} is backed only by failing tests {backing}"


def test_every_marked_claim_is_on_a_page_that_lists_its_proof():
    on_pages = {(p, c, v) for meta in PAGES.values() for p in meta["proofs"] for c, v in meta["claims"].items()}
    proofs = sorted({p.relative_to(ROOT).as_posix() for p in (ROOT / "proofs").rglob("proof_*.py")})
    orphans = [(p, t, c, v) for p in proofs for t, c, v in marked_claims(p) if (p, c, v) not in on_pages]
    assert not orphans, f"proof tests whose claim/verdict appears on no page listing the proof: {orphans}"


def test_a_claim_has_one_verdict_across_pages():
    seen: dict[str, tuple[str, str]] = {}
    for page, meta in PAGES.items():
        for cid, verdict in meta["claims"].items():
            if cid in seen:
                assert seen[cid][1] == verdict, f"{cid}: {seen[cid][0]} says {seen[cid][1]}, {page} says {verdict}"
            seen[cid] = (page, verdict)
