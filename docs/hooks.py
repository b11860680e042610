"""MkDocs hooks, so generated pages cannot drift from their sources:

- the front page (index.md) is README.md, its `docs/...` links made site-relative;
- the main job's page (main-job.md) is examples/bert_pretrain/README.md, with its loss curve;
- the configuration reference is rendered from tpformer/config/schema/ into the page that
  holds the `<!-- config-reference -->` marker.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[1]
CONFIG_MARKER = "<!-- config-reference -->"
EXAMPLE = ROOT / "examples" / "bert_pretrain"
EXAMPLE_CURVE = "assets/main_job_loss_curve.png"


def on_files(files: Files, config: Any) -> Files:
    files.append(
        File.generated(config, EXAMPLE_CURVE, abs_src_path=str(EXAMPLE / "loss_curve.png"))
    )
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    if page.file.src_uri == "index.md":
        return (ROOT / "README.md").read_text().replace("](docs/", "](")
    if page.file.src_uri == "main-job.md":
        text = (EXAMPLE / "README.md").read_text()
        return text.replace("](loss_curve.png)", f"]({EXAMPLE_CURVE})").replace(
            "](../../docs/", "]("
        )
    if CONFIG_MARKER in markdown:
        from tpformer.config.reference import config_reference_markdown

        return markdown.replace(CONFIG_MARKER, config_reference_markdown())
    return markdown
