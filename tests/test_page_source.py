"""The pages' Markdown source, checked without a build and without any proof having run.

An admonition (`!!! type "title"` or `??? type`) holds the lines indented under it. Python-Markdown ends the box at
the first non-blank line that is not indented, even in the middle of a paragraph: one unindented line inside a
30-second answer cut the Chinese box of inference/prefill-decode after half a sentence, printed the rest below it as
a plain paragraph with a stray `</div>`, and the cheat sheet and flashcards copied the truncated box.
"""

from __future__ import annotations

import re
from pathlib import Path

import markdown
import pytest
import yaml
from markdown.extensions import Extension
from markdown.treeprocessors import Treeprocessor

from tests.pages import DOCS, ROOT

ADMONITION = re.compile(r"^( *)(?:!!!|\?\?\?\+?)[ \t]")
FENCE = re.compile(r"^ *(`{3,}|~{3,})")


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def _front_matter_lines(lines: list[str]) -> int:
    """How many lines the YAML front matter takes (0 if there is none)."""
    if lines and lines[0] == "---":
        for i, line in enumerate(lines[1:], 1):
            if line == "---":
                return i + 1
    return 0


def admonitions(text: str) -> list[int]:
    """0-based line numbers of the admonition headers outside code fences and front matter."""
    lines = text.split("\n")
    heads, fence = [], None
    for i in range(_front_matter_lines(lines), len(lines)):
        line = lines[i]
        m = FENCE.match(line)
        if m:
            if fence is None:
                fence = m[1]
            elif m[1].startswith(fence[0]) and len(m[1]) >= len(fence):
                fence = None
            continue
        if fence is None and ADMONITION.match(line):
            heads.append(i)
    return heads


def unindented_continuations(text: str) -> list[tuple[int, str]]:
    """(1-based line, text) of every line that ends an admonition in the middle of its body: a non-blank line,
    indented less than the body, that follows a body line (or the header) with no blank line between."""
    lines = text.split("\n")
    bad = []
    for head in admonitions(text):
        body = _indent(lines[head]) + 4
        previous_blank = False
        for j in range(head + 1, len(lines)):
            if not lines[j].strip():
                previous_blank = True
                continue
            if _indent(lines[j]) < body:
                if not previous_blank:
                    bad.append((j + 1, lines[j]))
                break
            previous_blank = False
    return bad


def _markdown_extensions() -> tuple[list[str], dict]:
    """The extensions mkdocs.yml configures, except snippets (their includes sit in code fences, which a box
    boundary does not depend on)."""
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))
    names, options = [], {}
    for entry in config["markdown_extensions"]:
        name, opts = (entry, None) if isinstance(entry, str) else next(iter(entry.items()))
        if name == "pymdownx.snippets":
            continue
        names.append(name)
        if opts:
            options[name] = opts
    return names, options


class _TopLevel(Treeprocessor):
    """Records the document's top-level elements, as (tag, class) pairs, before any raw HTML is put back."""

    def run(self, root):
        self.md.top_level = [(child.tag, child.get("class", "")) for child in root]


class _RecordTopLevel(Extension):
    def extendMarkdown(self, md):
        md.treeprocessors.register(_TopLevel(md), "top_level", 100)


def _chunk(lines: list[str], head: int) -> str:
    """The admonition's header and everything up to the next blank line that is followed by an unindented line:
    what the author meant to be inside the box (a lazily unindented line included)."""
    j, outer = head + 1, _indent(lines[head])
    while j < len(lines):
        after = lines[j + 1] if j + 1 < len(lines) else ""
        if not lines[j].strip() and after.strip() and _indent(after) <= outer:
            break
        j += 1
    return "\n".join(lines[head:j])


def rendered_outside_the_box(text: str) -> list[tuple[int, list]]:
    """(1-based header line, the top-level elements) for every top-level admonition whose source renders, with
    Python-Markdown and the site's extensions, to anything besides the one box."""
    names, options = _markdown_extensions()
    md = markdown.Markdown(extensions=[*names, _RecordTopLevel()], extension_configs=options)
    lines = text.split("\n")
    bad = []
    for head in admonitions(text):
        if _indent(lines[head]):
            continue  # nested boxes are checked as part of their parent
        md.reset().convert(_chunk(lines, head))
        if len(md.top_level) != 1:
            bad.append((head + 1, md.top_level))
    return bad


PAGES = sorted(DOCS.rglob("*.md"))


@pytest.mark.parametrize("page", PAGES, ids=[p.relative_to(DOCS).as_posix() for p in PAGES])
def test_every_admonition_line_is_indented(page):
    text = page.read_text(encoding="utf-8")
    bad = unindented_continuations(text)
    where = page.relative_to(ROOT).as_posix()
    assert not bad, "a box ends mid-paragraph at an unindented line (indent it by 4 spaces):\n" + "\n".join(
        f"{where}:{n}: {line[:70]}" for n, line in bad)
    rendered = rendered_outside_the_box(text)
    assert not rendered, "an admonition renders to more than its box:\n" + "\n".join(
        f"{where}:{n}: {top}" for n, top in rendered)


BROKEN = '''---
title: t
---

!!! abstract "30 秒回答"
    第一行，缩进正确，
第二行没有缩进，框在这里被截断，
    第三行又缩进了。

After the box.
'''


def test_the_check_catches_an_unindented_line_in_a_box(tmp_path):
    """The defect that cut prefill-decode's Chinese 30-second box: one line without its 4-space indent. Both
    checks must name it, and both must pass once the line is indented."""
    broken = tmp_path / "broken.md"
    broken.write_text(BROKEN, encoding="utf-8")
    text = broken.read_text(encoding="utf-8")
    assert unindented_continuations(text) == [(7, "第二行没有缩进，框在这里被截断，")]
    ((line, top),) = rendered_outside_the_box(text)
    assert line == 5 and top[0] == ("div", "admonition abstract") and ("p", "") in top[1:]
    fixed = text.replace("\n第二行", "\n    第二行")
    assert unindented_continuations(fixed) == [] and rendered_outside_the_box(fixed) == []
    # a box ended properly (blank line, then unindented text), and a fenced example of one, are not flagged
    example = '!!! note\n    inside\n\noutside\n\n```markdown\n!!! note\nnot a box\n```\n'
    assert unindented_continuations(example) == [] and rendered_outside_the_box(example) == []
