"""Hand the search plugin each code block as plain text, then give the page its highlighted code back.

Material's search plugin reads every rendered page with Python's html.parser. Highlighted proof code is one <span>
per token (hundreds of thousands of tags over the site), and parsing them was about a third of a build's CPU time;
the text the index keeps from them is the same as from the plain code. So just before the search plugin reads the
page (priority 100; the plugin runs at 0) each highlighted block becomes <pre><code> with the same text, and just
after it (search_restore.py, priority -100) the page gets its highlighted HTML back for the template.
tests/test_site.py checks that the search index is the one the highlighted pages give.
"""

from __future__ import annotations

import re

from mkdocs.plugins import event_priority

HIGHLIGHT = re.compile(r'<div class="(?:[^"]*\s)?highlight(?:\s[^"]*)?"[^>]*>(.*?)</div>', re.S)
CODE = re.compile(r"<code\b[^>]*>(.*?)</code>", re.S)
TAG = re.compile(r"<[^>]+>")


def plain_code(html: str) -> str:
    """Each highlighted block -> <pre><code> of its text (entities kept as they are: still HTML)."""
    def one(m: re.Match) -> str:
        code = CODE.search(m[1])
        return m[0] if code is None else f"<pre><code>{TAG.sub('', code[1])}</code></pre>"
    return HIGHLIGHT.sub(one, html)


@event_priority(100)
def on_page_context(context, page, config, nav):
    page.highlighted_content = page.content
    page.content = plain_code(page.content)
    return context
