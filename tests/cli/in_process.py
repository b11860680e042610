"""A table of console-script cases run in one Python process (tests/cli/bad_input_cases.py),
for the parametrized bad-input tests: each case keeps its own test and its own working
directory, and the table pays the start-up once per test worker instead of once per case.

The entry point, its argument parsing, Hydra's composition and our error handling run as in a
console script; what one process per case would add is the interpreter's start-up, which the
tests that run the scripts as subprocesses (the launcher runs, `test_typo_fails_before_any_
process`) keep in view."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.cli.forked import run_script

REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Outcome:
    """What a console script left: its exit code, its output and the run directories kept."""

    code: object
    stdout: str
    stderr: str
    left: tuple[str, ...]


def selected_cases(request: pytest.FixtureRequest) -> list[dict[str, Any]]:
    """The parameters of the cases of the requesting test that this run selected (its first
    case alone in the quick tier, where a sweep runs one case): the table to run at once."""
    node = request.node
    return [
        item.callspec.params
        for item in request.session.items
        if isinstance(item, pytest.Function)
        and item.module is node.module
        and item.originalname == node.originalname
    ]


_TABLES: dict[tuple[str, tuple[tuple[str, ...], ...]], dict[tuple[str, ...], Outcome]] = {}
"""Each table's outcomes, run once per test worker."""


def outcome(
    script: str, argv: list[str], table: list[list[str]], request: pytest.FixtureRequest
) -> Outcome:
    """`script argv`'s outcome, the whole `table` (argv lists, `argv` among them) run at the
    first call, each case in its own directory under pytest's temporary directory; "{cwd}" in
    an argument names that directory."""
    key = (script, tuple(tuple(a) for a in table))
    if key not in _TABLES:
        root = request.getfixturevalue("tmp_path_factory").mktemp("cli-cases")
        _TABLES[key] = _run_table(script, key[1], root)
    return _TABLES[key][tuple(argv)]


def _run_table(
    script: str, table: tuple[tuple[str, ...], ...], root: Path
) -> dict[tuple[str, ...], Outcome]:
    cases = []
    for i, argv in enumerate(table):
        cwd = root / str(i)
        cwd.mkdir()
        cases.append([script, [a.replace("{cwd}", str(cwd)) for a in argv], str(cwd)])
    result = run_script(
        "tests.cli.bad_input_cases",
        [],
        input=json.dumps(cases),
        timeout=60 + 30 * len(cases),
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "COLUMNS": "100"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    from tests.cli.bad_input_cases import results

    return {
        argv: Outcome(code, out, err, tuple(left))
        for argv, (code, out, err, left) in zip(table, results(result.stdout), strict=True)
    }
