"""Every question page opens with a crisp answer and the push-back an interviewer will try.

The opening of a question page, read from its Markdown source with the regexes the study hook uses (so the cards,
the cheat sheet and this test agree on what the boxes are):

    !!! abstract "The 30-second answer"     at most 80 English words
    !!! abstract "30 秒回答"                 at most 160 Chinese characters
    ??? tip "If they push back"             at least 2 probes, each a paragraph opening with **"…?"**
    ??? tip "如果面试官追问"                  at least 2 probes, **"……？"**

Counting ignores math ($$…$$ and $…$), HTML comments (value markers) and HTML tags: English counts
whitespace-separated words, Chinese counts non-whitespace characters.
"""

from __future__ import annotations

import re
import sys

from tests.pages import DOCS, ROOT, question_pages

sys.path.insert(0, str(ROOT / "docs" / "hooks"))
import study  # noqa: E402  (docs/hooks/study.py, as the evidence hook imports it)

MAX_EN_WORDS, MAX_ZH_CHARS, MIN_PROBES = 80, 160, 2
COMMENT = re.compile(r"<!--.*?-->", re.S)
MATH_BLOCK = re.compile(r"\$\$.*?\$\$", re.S)
MATH_INLINE = re.compile(r"\$[^$]+?\$", re.S)
TAG = re.compile(r"<[^>]+>")


def stripped(text: str) -> str:
    """The text that is read out: no comments (value markers), no display or inline math, no HTML tags."""
    for pattern in (COMMENT, MATH_BLOCK, MATH_INLINE, TAG):
        text = pattern.sub(" ", text)
    return text


def english_words(text: str) -> int:
    return len(stripped(text).split())


def chinese_chars(text: str) -> int:
    return len(re.sub(r"\s", "", stripped(text)))


def opening(uri: str, meta: dict) -> study.Question:
    return study.question(uri, meta, (DOCS / uri).read_text(encoding="utf-8"), {})


def problems(q: study.Question) -> list[str]:
    """What is wrong with one page's opening, with the counts (empty when it is fine)."""
    out = []
    en, zh = english_words(q.answer_en), chinese_chars(q.answer_zh)
    if not q.answer_en:
        out.append("no English 30-second answer")
    elif en > MAX_EN_WORDS:
        out.append(f"English answer {en} words > {MAX_EN_WORDS}")
    if not q.answer_zh:
        out.append("no Chinese 30-second answer")
    elif zh > MAX_ZH_CHARS:
        out.append(f"Chinese answer {zh} characters > {MAX_ZH_CHARS}")
    for label, box in (('"If they push back"', q.pushback_en), ('"如果面试官追问"', q.pushback_zh)):
        n = len(study.probes(box))
        if not box:
            out.append(f"no {label} box")
        elif n < MIN_PROBES:
            out.append(f"{label} has {n} probe(s) < {MIN_PROBES}")
    return out


def test_counter_on_a_literal():
    en = ('If $q$ and $k$ have variance 1, $$q\\cdot k = \\sum_i q_i k_i$$ has variance '
          '<!-- value: test_x / Var(q·k) at d_k=64 --> <span class="value">64</span> **so** scale it.')
    # If, and, have, variance, 1,, has, variance, 64, **so**, scale, it.  (math, the marker and tags removed)
    assert english_words(en) == 11
    zh = "若 $q$、$k$ 的方差为 1，\n<!-- value: t / n -->点积方差为 <b>$d_k$</b>。"
    # 若、的方差为1，点积方差为。  (punctuation and digits count; math, the marker and tags do not)
    assert chinese_chars(zh) == 14
    assert english_words("") == chinese_chars("") == 0


def test_probes_on_a_literal():
    box = ('**"Isn\'t that just the vanishing\ngradient?"** Not at $d_k=64$.\n\n'
           '**"代价多大？"** 很小。\n\n**Note** a bold word is not a probe. Is it?\n\n'
           'Not at a line start: **"hidden?"**')
    assert study.probes(box) == ['**"Isn\'t that just the vanishing\ngradient?"**', '**"代价多大？"**']
    page = ('!!! abstract "The 30-second answer"\n    Short.\n\n??? tip "If they push back"\n    **"One?"** A.\n\n'
            '    **"Two?"** B.\n\n??? tip "如果面试官追问"\n    **"一？"** 甲。\n\n<!-- claims -->\n')
    q = study.question("area/page.md", {}, page, {})
    assert q.answer_en == "Short." and len(study.probes(q.pushback_en)) == 2 and len(study.probes(q.pushback_zh)) == 1
    assert problems(q) == ["no Chinese 30-second answer", '"如果面试官追问" has 1 probe(s) < 2']


def test_every_question_page_opens_crisply():
    """Fails naming every page whose opening is too long or lacks the push-back boxes (expected to fail until
    every page is rewritten to the new opening)."""
    pages = question_pages()
    assert pages
    bad = {uri: p for uri, meta in pages.items() if (p := problems(opening(uri, meta)))}
    report = "\n".join(f"  {uri}: {'; '.join(p)}" for uri, p in sorted(bad.items()))
    assert not bad, f"{len(bad)} of {len(pages)} question pages do not open crisply:\n{report}"

