"""The packages depend on each other one way only (docs/architecture.md, "The rules the guard tests
hold"): the parallel core needs no Hydra schema, the engine wraps any model, checkpoint I/O knows no
engine, models know only layers and never torch.distributed."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "tpformer"

FORBIDDEN = {
    "parallel": [
        "tpformer.config",
        "tpformer.layers",
        "tpformer.models",
        "tpformer.engine",
        "tpformer.train",
        "tpformer.checkpoint",
    ],
    "layers": ["tpformer.models", "tpformer.engine", "tpformer.train", "tpformer.checkpoint"],
    "models": ["tpformer.engine", "tpformer.train", "tpformer.checkpoint", "torch.distributed"],
    "engine": ["tpformer.layers", "tpformer.models", "tpformer.train", "tpformer.checkpoint"],
    "checkpoint": ["tpformer.engine", "tpformer.models", "tpformer.layers", "tpformer.train"],
    "planner": ["tpformer.train", "tpformer.checkpoint"],
    "data": [
        "tpformer.engine",
        "tpformer.models",
        "tpformer.layers",
        "tpformer.train",
        "tpformer.checkpoint",
    ],
    "interop": ["tpformer.engine", "tpformer.train", "tpformer.checkpoint", "tpformer.data"],
    "inference": ["tpformer.engine", "tpformer.train", "tpformer.checkpoint", "tpformer.data"],
    "train": [],
    "config": [],  # held by CONFIG_MAY_IMPORT below: an allow-list, not a deny-list
}
CONFIG_MAY_IMPORT = ["tpformer.config", "tpformer.parallel.layout"]
"""The schema sits at the bottom of the house: beside itself it reads only the pure layout
arithmetic (divisors, Layout, check_split), so no rule of config/ reaches up into the planner,
the engine or a model."""
for _forbidden in FORBIDDEN.values():  # console scripts sit on top: nothing imports them
    _forbidden.append("tpformer.cli")


def imports_of(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_package_imports_flow_one_way(package: str) -> None:
    bad = [
        f"{path.relative_to(PACKAGE)} imports {name}"
        for path in sorted((PACKAGE / package).rglob("*.py"))
        for name in sorted(imports_of(path))
        if any(name == f or name.startswith(f + ".") for f in FORBIDDEN[package])
    ]
    assert bad == []


def test_config_imports_only_itself_and_the_layout_arithmetic() -> None:
    bad = [
        f"{path.relative_to(PACKAGE)} imports {name}"
        for path in sorted((PACKAGE / "config").rglob("*.py"))
        for name in sorted(imports_of(path))
        if name.startswith("tpformer")
        and not any(name == a or name.startswith(a + ".") for a in CONFIG_MAY_IMPORT)
    ]
    assert bad == []


def _loaded_after(imports: str, modules: list[str]) -> list[str]:
    """Which of `modules` a fresh interpreter holds after `import <imports>`."""
    import subprocess
    import sys

    code = f"import sys, {imports}; print([m for m in {modules!r} if m in sys.modules])"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return list(ast.literal_eval(result.stdout.strip()))


@pytest.mark.slow  # over 5 s (the quick tier leaves single cases that long to the full run)
def test_a_run_that_does_not_compile_never_imports_dynamo() -> None:
    """torch._dynamo costs 1 - 1.5 s per process to import: no module of ours pulls it in
    (eager islands are marks until trainer.compile). Building torch.optim's AdamW imports it
    all the same (torch 2.13 wraps Optimizer.__init__ in its dynamo guard), so every training
    rank pays it once; a refused input and a launcher process do not."""
    imports = "tpformer.cli.pretrain, tpformer.cli.finetune, tpformer.models"
    assert _loaded_after(f"{imports}, tpformer.engine.parallelize", ["torch._dynamo"]) == []


@pytest.mark.slow  # over 5 s (the quick tier leaves single cases that long to the full run)
def test_the_entry_points_load_no_training_stack_until_a_rank_runs() -> None:
    """A refused input and the launcher process (which only re-runs the command on N ranks)
    never import DCP, DTensor or the training loop (about 1.5 s a start), and the config's
    validation imports no torch at all."""
    heavy = ["torch.distributed.checkpoint", "torch.distributed.tensor", "tpformer.train.loop"]
    assert _loaded_after("tpformer.cli.pretrain, tpformer.cli.finetune", heavy) == []
    assert _loaded_after("tpformer.config.validate", ["torch"]) == []


def _module_graph() -> dict[str, set[str]]:
    """tpformer's modules -> the tpformer modules each imports anywhere in its file (at the
    top, inside a function, under TYPE_CHECKING): a circle is a circle wherever it is drawn."""
    paths = {}
    for path in PACKAGE.rglob("*.py"):
        name = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        paths[name.removesuffix(".__init__")] = path
    graph: dict[str, set[str]] = {name: set() for name in paths}
    for name, path in paths.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                graph[name] |= {a.name for a in node.names if a.name in paths}
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                for alias in node.names:  # `from package import module` names the module
                    full = f"{node.module}.{alias.name}"
                    target = full if full in paths else node.module
                    if target in paths:
                        graph[name].add(target)
    return graph


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in sorted(graph[node]):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            group = []
            while not group or group[-1] != node:
                group.append(stack.pop())
            if len(group) > 1:
                circles.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return circles


def test_no_module_imports_one_that_imports_it_back() -> None:
    """E.g. train/task.py naming train/loop.py's Trainer (which imports task.py) for a type:
    an evaluator takes the narrow EvalSteps instead."""
    assert _circles(_module_graph()) == []
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
