"""Only tpformer/parallel/ talks to torch.distributed: every collective, point-to-point transfer,
barrier and process-group creation goes through it (docs/architecture.md, "The rules the guard tests
hold": the only package that creates process groups or calls a collective). Elsewhere a module may
use torch.distributed's libraries that are not communication calls: DCP
(`torch.distributed.checkpoint`), DTensor (`torch.distributed.tensor`) and the launcher
(`torch.distributed.run`, `.elastic`, `.launcher`)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "tpformer"
ALLOWED = ("torch.distributed.checkpoint", "torch.distributed.tensor", "torch.distributed.run")
ALLOWED_PREFIXES = (*ALLOWED, "torch.distributed.elastic", "torch.distributed.launcher")


def _allowed(module: str) -> bool:
    return any(module == p or module.startswith(p + ".") for p in ALLOWED_PREFIXES)


def _violations(path: Path) -> list[str]:
    """Imports of torch.distributed itself (or a name from it) and `torch.distributed.<x>`
    attribute uses that are not one of the allowed libraries."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [
                f"line {node.lineno}: import {a.name}"
                for a in node.names
                if a.name.startswith("torch.distributed") and not _allowed(a.name)
            ]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
            "torch.distributed"
        ):
            module = node.module or ""
            names = [a.name for a in node.names if not _allowed(f"{module}.{a.name}")]
            if not _allowed(module) and names:
                found.append(f"line {node.lineno}: from {module} import {', '.join(names)}")
        elif isinstance(node, ast.Attribute):
            chain = ast.unparse(node)
            if chain.startswith("torch.distributed.") and not _allowed(chain):
                found.append(f"line {node.lineno}: {chain}")
    return found


def test_only_parallel_calls_torch_distributed() -> None:
    offenders = {
        str(path.relative_to(PACKAGE)): bad
        for path in sorted(PACKAGE.rglob("*.py"))
        if path.relative_to(PACKAGE).parts[0] != "parallel" and (bad := _violations(path))
    }
    assert not offenders, offenders


def test_the_check_finds_a_call(tmp_path: Path) -> None:
    """It can fail: each form of reaching torch.distributed is caught; the libraries are not."""
    sample = tmp_path / "sample.py"
    sample.write_text(
        "import torch.distributed as dist\n"
        "from torch.distributed import all_reduce\n"
        "import torch\n"
        "torch.distributed.barrier()\n"
        "import torch.distributed.checkpoint as dcp\n"
        "from torch.distributed.tensor import DTensor\n"
    )
    assert [v.split(":")[0] for v in _violations(sample)] == ["line 1", "line 2", "line 4"]


MONITORS = {"FlightRecorder", "WaitClock", "CommMonitor"}


def _module_level_monitors(source: str) -> list[str]:
    """Module-level assignments of a recorder, wait clock or monitor: a process-wide singleton
    where the ParallelContext should own it (parallel/monitor.py)."""
    return [
        ast.unparse(node)
        for node in ast.parse(source).body
        if isinstance(node, (ast.Assign, ast.AnnAssign))
        and isinstance(node.value, ast.Call)
        and ast.unparse(node.value.func).split(".")[-1] in MONITORS
    ]


def test_the_collective_monitor_belongs_to_the_context() -> None:
    assert _module_level_monitors("RECORDER = FlightRecorder()\nx = f()\n") == [
        "RECORDER = FlightRecorder()"
    ]
    globals_ = {
        str(path.relative_to(PACKAGE)): found
        for path in sorted(PACKAGE.rglob("*.py"))
        if (found := _module_level_monitors(path.read_text()))
    }
    assert globals_ == {}
