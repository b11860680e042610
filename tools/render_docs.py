"""Write the docs pages that come from other sources into the repository, so they read the same
on the repository as on the site; `--check` (run by tests/test_docs_fresh.py in CI) exits 1
naming every page that is stale.

    docs/index.md            README.md, its docs/ links made relative to docs/
    docs/main-job.md         examples/bert_pretrain/README.md (+ its loss curve in docs/assets/)
    docs/configuration.md    the reference between <!-- config-reference --> markers, from the
                             schema (tpformer/config/schema/)
    docs/*.md                each <!-- transcript: COMMAND --> block: the command run in an
                             empty directory and what it printed (COLUMNS=100)

python tools/render_docs.py          # rewrite what is stale
python tools/render_docs.py --check  # exit 1 if anything is
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
EXAMPLE = ROOT / "examples" / "bert_pretrain"
CURVE = "assets/main_job_loss_curve.png"
REFERENCE = re.compile(r"(<!-- config-reference -->\n).*?(<!-- /config-reference -->)", re.S)
TRANSCRIPT = re.compile(r"(<!-- transcript: (.+?) -->\n).*?(<!-- /transcript -->)", re.S)


def generated_note(source: str) -> str:
    return f"<!-- generated from {source} by tools/render_docs.py: edit that file, not this -->\n"


def index_page() -> str:
    return generated_note("README.md") + (ROOT / "README.md").read_text().replace("](docs/", "](")


def main_job_page() -> str:
    text = (EXAMPLE / "README.md").read_text()
    text = text.replace("](loss_curve.png)", f"]({CURVE})").replace("](../../docs/", "](")
    return generated_note("examples/bert_pretrain/README.md") + text


def with_reference(page: str) -> str:
    sys.path.insert(0, str(ROOT))
    from tpformer.config.reference import config_reference_markdown

    return REFERENCE.sub(
        lambda m: m.group(1) + config_reference_markdown().strip() + "\n" + m.group(2), page
    )


def run_transcript(command: str) -> str:
    """What `command` prints (stderr and stdout, as a terminal shows them) in an empty
    directory, as a ```text block starting with the command."""
    env = {**os.environ, "COLUMNS": "100", "PYTHONPATH": str(ROOT), "HYDRA_FULL_ERROR": ""}
    with tempfile.TemporaryDirectory() as empty:
        done = subprocess.run(
            shlex.split(command),
            cwd=empty,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
    output = (done.stdout + done.stderr).rstrip()
    return f"```text\n$ {command}\n{output}\n```\n"


def with_transcripts(page: str) -> str:
    return TRANSCRIPT.sub(lambda m: m.group(1) + run_transcript(m.group(2)) + m.group(3), page)


def rendered() -> dict[Path, str | bytes]:
    """Every generated file and its content."""
    pages: dict[Path, str | bytes] = {
        DOCS / "index.md": index_page(),
        DOCS / "main-job.md": main_job_page(),
        DOCS / CURVE: (EXAMPLE / "loss_curve.png").read_bytes(),
    }
    for path in sorted(DOCS.rglob("*.md")):
        if path in pages:
            continue
        text = path.read_text()
        new = with_transcripts(with_reference(text))
        if new != text:
            pages[path] = new
    return pages


def stale(pages: dict[Path, str | bytes]) -> list[Path]:
    def current(path: Path, content: str | bytes) -> bool:
        if not path.is_file():
            return False
        return (path.read_bytes() if isinstance(content, bytes) else path.read_text()) == content

    return [path for path, content in pages.items() if not current(path, content)]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--check", action="store_true", help="exit 1 if a page is stale")
    args = parser.parse_args()
    pages = rendered()
    old = stale(pages)
    if args.check:
        for path in old:
            print(f"stale: {path.relative_to(ROOT)} (run python tools/render_docs.py)")
        sys.exit(1 if old else 0)
    for path in old:
        path.parent.mkdir(parents=True, exist_ok=True)
        content = pages[path]
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)
        print(f"wrote {path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
