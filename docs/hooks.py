"""MkDocs hook: renders the configuration reference from tpformer/config/schema.py into the page
that holds the marker, so the reference is rebuilt from the code on every docs build."""

from __future__ import annotations

from typing import Any

MARKER = "<!-- config-reference -->"


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    if MARKER not in markdown:
        return markdown
    from tpformer.config.reference import config_reference_markdown

    return markdown.replace(MARKER, config_reference_markdown())
