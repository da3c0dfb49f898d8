"""The second half of search_plain.py: after the search plugin has read the page, the template gets the
highlighted code back."""

from __future__ import annotations

from mkdocs.plugins import event_priority


@event_priority(-100)
def on_page_context(context, page, config, nav):
    if hasattr(page, "highlighted_content"):
        page.content = page.highlighted_content
        del page.highlighted_content
    return context
