"""The shell commands the documentation shows, and the tests that run them (issue 68: every
documented command is run by a test at tiny sizes, or marked with why it cannot run here).

A command is a line of a ``bash``/``sh``/``shell``/``console`` fenced block (continuation lines
joined, a trailing ``# comment`` and a ``$`` prompt dropped) or an inline code span in a table row
that starts with an executable and has arguments. A test claims a command by taking its text from
the docs through `documented` (or tests/docs/runs.py's `DocumentedRun`), so a changed command
fails the test that ran the old one; a marker comment on the line before a block or table says
why its commands do not run here:

    <!-- not run by the tests: needs 8 GPUs -->
    <!-- not run by the tests ("wandb sync"): uploads to wandb.ai -->

The first form covers every command of the block, the second those containing the quoted text.
Commands `.ci/run` runs (the install, the tests, the docs build) are claimed by CI.
"""

from __future__ import annotations

import functools
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
GENERATED = {"docs/index.md", "docs/main-job.md"}  # copies of README.md and the example's README
EXECUTABLES = ("tpformer-", "python ", "torchrun ", "pip ", "bash ", "mkdocs ", "PYTHONPATH=",
               "WANDB_", "wandb ", "sbatch ")  # fmt: skip
FENCE = re.compile(r"^```(\w*)\s*$")
MARKER = re.compile(r"<!-- not run by the tests(?: \(\"(?P<only>[^\"]+)\"\))?: (?P<why>.+?) -->")


@dataclass(frozen=True)
class DocCommand:
    """One documented command: where it is, its text, and the reason it is not run, if marked."""

    page: str
    line: int
    text: str
    not_run: str | None = None

    def where(self) -> str:
        return f"{self.page}:{self.line}: {self.text}"


def pages() -> list[Path]:
    """The hand-written pages: README.md, the examples' READMEs and docs/ (not the copies)."""
    found = [REPO / "README.md", *sorted((REPO / "examples").rglob("README.md"))]
    found += sorted((REPO / "docs").rglob("*.md"))
    return [p for p in found if str(p.relative_to(REPO)) not in GENERATED]


def _marker_reasons(line: str) -> list[tuple[str | None, str]]:
    return [(m.group("only"), m.group("why")) for m in MARKER.finditer(line)]


def _fenced_commands(lines: list[str]) -> list[tuple[int, str]]:
    """(line number, command) of one fenced block's lines (starting at its first line)."""
    found, pending, start = [], "", 0
    for number, raw in lines:
        line = raw.strip().removeprefix("$ ")
        if not pending:
            start = number
        if line.endswith("\\"):
            pending += line[:-1].strip() + " "
            continue
        command = _without_comment(pending + line).strip()
        pending = ""
        if command and not command.startswith("#"):
            found.append((start, command))
    return found


def _without_comment(command: str) -> str:
    """The command before a trailing ` # comment` (a # inside quotes is kept)."""
    quote = None
    for i, char in enumerate(command):
        if quote:
            quote = None if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#" and (i == 0 or command[i - 1] == " "):
            return command[:i].rstrip()
    return command


def _table_commands(line: str) -> list[str]:
    spans = re.findall(r"`([^`]+)`", line)
    return [s for s in spans if s.startswith(EXECUTABLES) and " " in s.strip()]


def page_commands(page: Path, root: Path = REPO) -> list[DocCommand]:
    """The commands of one page (named relative to `root`), each with the marker of the block or
    table it is in."""
    name = str(page.relative_to(root))
    lines = page.read_text().splitlines()
    found: list[DocCommand] = []
    markers: list[tuple[str | None, str]] = []  # the markers of the coming block or table
    block: list[tuple[int, str]] | None = None
    shell = False
    in_table = False
    for number, line in enumerate(lines, 1):
        fence = FENCE.match(line.strip())
        if block is not None:
            if fence:
                if shell:
                    found += _marked(name, _fenced_commands(block), markers)
                block, markers = None, []
            else:
                block.append((number, line))
            continue
        if fence:
            block, shell = [], fence.group(1) in ("bash", "sh", "shell", "console")
            continue
        if line.startswith("|"):
            in_table = True
            found += _marked(name, [(number, c) for c in _table_commands(line)], markers)
            continue
        if in_table:  # the table ended: its markers with it
            in_table, markers = False, []
        if _marker_reasons(line):  # consecutive marker lines add up
            markers += _marker_reasons(line)
        elif line.strip():
            markers = []
    return found


def _marked(
    page: str, commands: list[tuple[int, str]], markers: list[tuple[str | None, str]]
) -> list[DocCommand]:
    out = []
    for number, text in commands:
        reasons = [why for only, why in markers if only is None or only in text]
        out.append(DocCommand(page, number, text, reasons[0] if reasons else None))
    return out


@functools.cache
def documented_commands() -> tuple[DocCommand, ...]:
    """Every command of every hand-written page, in page order (read once per process)."""
    return tuple(c for page in pages() for c in page_commands(page))


def documented(start: str) -> str:
    """The one documented command text that starts with `start`, or equals it (a test's claim
    on it): the test runs what the docs say, so editing the command fails the test until it
    runs the new one. Fails when no command, or two different ones, start so."""
    texts = {c.text for c in documented_commands() if c.text.startswith(start)}
    if start in texts:  # a whole command, which a longer one may extend
        return start
    assert len(texts) == 1, f"{len(texts)} documented commands start with {start!r}: {texts}"
    return texts.pop()


def arguments(command: str, replace: dict[str, str] | None = None) -> tuple[dict, list[str]]:
    """The command's leading `NAME=value` environment and its words after the executable, with
    the docs' text replaced where a test says so (`replace`: sizes, or its own files' names),
    split as the shell would."""
    for documented_text, here in (replace or {}).items():
        assert documented_text in command, (documented_text, command)
        command = command.replace(documented_text, here)
    words = [word for word in shlex.split(command) if word != "..."]  # "your other overrides"
    env = {}
    while "=" in words[0] and not words[0].startswith("-"):
        name, _, value = words.pop(0).partition("=")
        env[name] = value
    return env, words[1:]


def with_sizes(argv: list[str], sizes: list[str]) -> list[str]:
    """argv, then each of `sizes` whose key argv does not set: a test shrinks what the command
    leaves to its defaults and says, through `replace`, what it changes of what the command sets."""
    given = {a.split("=", 1)[0] for a in argv if "=" in a}
    return [*argv, *(s for s in sizes if s.split("=", 1)[0] not in given)]
