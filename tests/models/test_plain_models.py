"""The models describe the network: no branch in models/ asks about the parallel layout.

Sequence and context parallelism enter through layers/sequence.SequenceRows, tensor parallelism
through the layers, KV caching through inference/; a condition in models/ that names a group, a
rank, a degree or a cache fails here (as tests/test_distributed_layering.py does for
torch.distributed calls outside parallel/).
"""

from __future__ import annotations

import ast
from pathlib import Path

MODELS = Path(__file__).resolve().parents[2] / "tpformer" / "models"
LAYOUT_NAMES = {
    "tp",
    "cp",
    "dp",
    "pp",
    "rank",
    "size",
    "sequence_parallel",
    "split_over_context",
    "sequence_group",
    "context",
    "cache",
    "caches",
    "ctx",
}


def _names(node: ast.AST) -> set[str]:
    found = set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name):
            found.add(sub.id)
        elif isinstance(sub, ast.Attribute):
            found.add(sub.attr)
    return found


def layout_branches(source: str) -> list[tuple[int, str]]:
    """(line, condition) of each if, conditional expression, while or comprehension filter whose
    condition names something of the parallel layout or a KV cache."""
    found = []
    for node in ast.walk(ast.parse(source)):
        tests: list[ast.expr] = []
        if isinstance(node, (ast.If, ast.IfExp, ast.While)):
            tests = [node.test]
        elif isinstance(node, ast.comprehension):
            tests = list(node.ifs)
        for test in tests:
            if _names(test) & LAYOUT_NAMES:
                found.append((test.lineno, ast.unparse(test)))
    return found


def test_the_checker_finds_layout_branches() -> None:
    source = "if self.cp.size > 1:\n    x = 1\ny = a if ctx.sequence_parallel else b\nif n: pass\n"
    assert layout_branches(source) == [(1, "self.cp.size > 1"), (3, "ctx.sequence_parallel")]


def test_models_have_no_branch_on_the_parallel_layout() -> None:
    branches = {
        f"{path.name}:{line}": test
        for path in sorted(MODELS.glob("*.py"))
        for line, test in layout_branches(path.read_text())
    }
    assert branches == {}
