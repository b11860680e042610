"""Every shell command the documentation shows is run by a test, or says why it cannot run here
(issue 68): a test claims a command by reading it from the docs with `documented(start)`
(tests/docs/commands.py), CI runs the install, lint, docs and test commands (`.ci/run`, held
below line by line), and a marker comment before a block or table gives the reason for the rest
(a GPU, several nodes, a hub download). A new command with neither fails here."""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

from tests.docs.commands import (
    MARKER,
    REPO,
    DocCommand,
    documented,
    documented_commands,
    page_commands,
)

TEST_EXTRA = "python -m pip install --quiet -e '.[test,demo,pretrained,docs]'"
"""CI's install: the extras every documented install names (wandb is in the test extra)."""
CI_RUNS = {  # a documented command -> the lines of .ci/run or .ci/wheel_check that run it
    "pip install torch==2.13.0 && pip install -e '.[test,demo,pretrained,docs]'": [
        "python -m pip install --quiet torch==2.13.0",
        TEST_EXTRA,
    ],
    "pip install torch==2.13.0 && pip install -e '.[test,demo,pretrained]' && python -m pytest "
    "tests": ["python -m pip install --quiet torch==2.13.0", TEST_EXTRA, "python -m pytest tests"],
    "pip install torch==2.13.0 && pip install -e '.[test,demo,docs]'": [TEST_EXTRA],
    "pip install torch==2.13.0 && pip install -e '.[demo]'": [TEST_EXTRA],
    "pip install -e '.[wandb]'": [TEST_EXTRA],
    "python -m pytest tests": ["python -m pytest tests"],
    'python -m pytest tests -m "not slow"': ["python -m pytest tests"],  # a subset of it
    "mkdocs build --strict": ['mkdocs build --strict --site-dir "$(mktemp -d)/site"'],
    "bash .ci/wheel_check": ["bash .ci/wheel_check"],
    "bash .ci/run": ["python -m pytest tests"],  # CI itself: the file is the command
    "pip install .": ['"$py" -m pip install --quiet "$work"/dist/tpformer-*.whl'],
    "pip wheel --no-deps -w dist . && pip install dist/tpformer-*.whl": [
        'python -m pip wheel --quiet --no-deps --wheel-dir "$work/dist" "$repo"',
        '"$py" -m pip install --quiet "$work"/dist/tpformer-*.whl',
    ],
}
CLAIMS = ("documented", "DocumentedRun")
"""The calls whose first argument, a string, claims the documented command it starts."""


@functools.cache
def claimed_starts() -> dict[str, list[str]]:
    """Each claim's string in the tests (`documented("...")`, `DocumentedRun("...", ...)`),
    with the files that make it."""
    claims: dict[str, list[str]] = {}
    for path in sorted((REPO / "tests").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and getattr(node.func, "id", None) in CLAIMS
                and node.args
                and isinstance(node.args[0], ast.Constant)
                and isinstance(node.args[0].value, str)
            ):
                claims.setdefault(node.args[0].value, []).append(str(path.relative_to(REPO)))
    return claims


def claimed_commands() -> set[str]:
    """The documented commands the tests' claims name."""
    return {documented(start) for start in claimed_starts()}


def test_every_documented_command_is_run_or_says_why_not() -> None:
    claimed = claimed_commands()
    ci_lines = [
        line.strip()
        for script in ("run", "wheel_check")
        for line in (REPO / ".ci" / script).read_text().splitlines()
    ]
    for command, lines in CI_RUNS.items():
        assert all(line in ci_lines for line in lines), (command, lines)
    unrun = [
        c.where()
        for c in documented_commands()
        if c.not_run is None and c.text not in CI_RUNS and c.text not in claimed
    ]
    assert not unrun, "documented commands no test runs and no marker excuses:\n" + "\n".join(unrun)


def test_each_claim_names_one_documented_command() -> None:
    for start in claimed_starts():
        documented(start)  # raises when none, or two different commands, start so


def test_a_marked_command_is_not_also_claimed() -> None:
    """A marker is for what cannot run here: a command a test runs must not carry one."""
    claimed = claimed_commands()
    both = [c.where() for c in documented_commands() if c.not_run and c.text in claimed]
    assert not both, "\n".join(both)


def test_the_reader_finds_blocks_tables_continuations_and_markers(tmp_path: Path) -> None:
    page = tmp_path / "docs" / "case.md"
    text = """Intro.

```bash
tpformer-pretrain a=1 \\
    b=2   # a comment
# a whole-line comment
$ tpformer-plan 'x="# kept"'
```

<!-- not run by the tests ("torchrun"): needs 8 GPUs -->
```bash
torchrun --nproc_per_node 8 -m tpformer.cli.pretrain
tpformer-convert to-hf a b
```

```text
tpformer-pretrain not a shell block
```

<!-- not run by the tests: several nodes -->
| layout | command |
|---|---|
| x | `tpformer-pretrain parallel.tensor=2` and `tpformer-plan` |

| y | `tpformer-pretrain model=bert_tiny` |
"""
    page.parent.mkdir()
    page.write_text(text)
    found = page_commands(page, root=tmp_path)
    assert [(c.line, c.text, c.not_run) for c in found] == [
        (4, "tpformer-pretrain a=1 b=2", None),
        (7, "tpformer-plan 'x=\"# kept\"'", None),
        (12, "torchrun --nproc_per_node 8 -m tpformer.cli.pretrain", "needs 8 GPUs"),
        (13, "tpformer-convert to-hf a b", None),
        (23, "tpformer-pretrain parallel.tensor=2", "several nodes"),
        (25, "tpformer-pretrain model=bert_tiny", None),
    ]
    assert MARKER.search("<!-- not run by the tests: a GPU -->")


@pytest.mark.parametrize("start", ["tpformer-nothing", "tpformer-pretrain"])
def test_a_claim_must_name_exactly_one_command(start: str) -> None:
    with pytest.raises(AssertionError, match="documented commands start with"):
        documented(start)


def test_a_command_is_named_with_its_place() -> None:
    command = DocCommand("docs/x.md", 3, "tpformer-plan")
    assert command.where() == "docs/x.md:3: tpformer-plan"
