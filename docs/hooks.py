"""MkDocs hooks, so generated pages cannot drift from their sources:

- the configuration reference is rendered from tpformer/config/schema.py into the page that
  holds the `<!-- config-reference -->` marker;
- the front page (index.md) is README.md, with its `docs/...` links made site-relative.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

CONFIG_MARKER = "<!-- config-reference -->"
README = Path(__file__).resolve().parents[1] / "README.md"


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    if page.file.src_uri == "index.md":
        return README.read_text().replace("](docs/", "](")
    if CONFIG_MARKER in markdown:
        from tpformer.config.reference import config_reference_markdown

        return markdown.replace(CONFIG_MARKER, config_reference_markdown())
    return markdown
