"""Helpers shared by the site tests: the question pages' front matter and the proofs' evidence."""

from __future__ import annotations

import functools
from pathlib import Path
from urllib.parse import unquote, urlsplit

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


def question_urls() -> set[str]:
    """The built site's folder of every question page ("attention/masks/")."""
    return {p.removesuffix(".md") + "/" for p in question_pages()}


def site_target(site: Path, folder: Path, ref: str) -> Path | None:
    """What a relative URL `ref` in a built file under `folder` points at inside `site` (a folder means its
    index.html; a path from "/" starts at the site's root); None for another host or a path climbing out of the site.
    Whether the file is there is for the caller to check."""
    parts = urlsplit(ref)
    if parts.scheme or parts.netloc:
        return None
    root = site.resolve()
    target = ((root if parts.path.startswith("/") else folder) / unquote(parts.path).lstrip("/")).resolve()
    if target.is_dir():
        target /= "index.html"
    return target if target.is_relative_to(root) else None


@functools.cache  # one read per test process: every page's contract test asks for it
def registry() -> dict[str, dict]:
    return yaml.safe_load((ROOT / "proofs" / "claims.yml").read_text(encoding="utf-8"))
