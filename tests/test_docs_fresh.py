"""The pages generated from other sources (README.md, the example's README, the schema's
reference, the command transcripts of the docs) are in the repository as they render now:
`python tools/render_docs.py` rewrites them."""

from __future__ import annotations

import pytest

from tools.render_docs import DOCS, ROOT, index_page, main_job_page, rendered, stale, with_reference


@pytest.mark.slow
def test_every_generated_page_is_fresh() -> None:
    """With the transcripts: each runs its command (a few seconds each)."""
    old = [str(path.relative_to(ROOT)) for path in stale(rendered())]
    assert old == [], "stale; run python tools/render_docs.py"


def test_the_copied_pages_and_the_reference_are_fresh() -> None:
    assert (DOCS / "index.md").read_text() == index_page()
    assert (DOCS / "main-job.md").read_text() == main_job_page()
    page = (DOCS / "configuration.md").read_text()
    assert "parallel.tensor" in page.split("<!-- config-reference -->")[1]
    assert with_reference(page) == page
