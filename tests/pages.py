"""Helpers shared by the site tests: the question pages' front matter and the proofs' evidence."""

from __future__ import annotations

import functools
from pathlib import Path

import yaml

from proofs import evidence as E

ROOT = E.ROOT
DOCS = ROOT / "docs"


def front_matter(path: Path) -> dict:
    text = path.read_text(encoding="utf-8")
    if not text.startswith("---\n"):
        return {}
    return yaml.safe_load(text.split("---\n", 2)[1]) or {}


def question_pages() -> dict[str, dict]:
    """docs-relative path -> front matter, for every page that settles claims."""
    pages = {}
    for p in sorted(DOCS.rglob("*.md")):
        meta = front_matter(p)
        if meta.get("claims"):
            pages[p.relative_to(DOCS).as_posix()] = meta
    return pages


@functools.cache  # one read per test process: every page's contract test asks for it
def registry() -> dict[str, dict]:
    return yaml.safe_load((ROOT / "proofs" / "claims.yml").read_text(encoding="utf-8"))
