"""Files and functions stay small enough to read (docs/architecture.md, "The rules the guard tests
hold"): no module in tpformer/ over MAX_FILE_LINES lines, no function over MAX_FUNCTION_LINES. A
growing one splits by concept."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "tpformer"
MAX_FILE_LINES = 400
MAX_FUNCTION_LINES = 60


def test_no_module_is_over_the_line_limit() -> None:
    long = {
        str(p.relative_to(PACKAGE)): n
        for p in sorted(PACKAGE.rglob("*.py"))
        if (n := len(p.read_text().splitlines())) > MAX_FILE_LINES
    }
    assert long == {}


def test_no_function_is_over_the_line_limit() -> None:
    long = {
        f"{p.relative_to(PACKAGE)}:{node.name}": node.end_lineno - node.lineno + 1
        for p in sorted(PACKAGE.rglob("*.py"))
        for node in ast.walk(ast.parse(p.read_text()))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        and node.end_lineno is not None
        and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES
    }
    assert long == {}
