"""tests/budget.py holds whole-suite runs to their budget in units of a reference workload timed
in the same run, and leaves partial runs alone."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from tests.budget import FULL_BUDGET, QUICK_BUDGET, TESTS, Held, held_budget, reference_seconds


def _config(*args: str, markexpr: str = "", keyword: str = "", **extra: Any) -> Any:
    option = SimpleNamespace(markexpr=markexpr, keyword=keyword, deselect=None, lf=False)
    return SimpleNamespace(option=option, args=list(args), **extra)


def test_the_whole_suite_and_the_quick_tier_are_held() -> None:
    assert held_budget(_config("tests")) == ("the full suite", FULL_BUDGET)
    assert held_budget(_config(str(TESTS))) == ("the full suite", FULL_BUDGET)
    quick = held_budget(_config("tests", markexpr="not slow"))
    assert quick == ("the quick tier", QUICK_BUDGET)


@pytest.mark.parametrize(
    "config",
    [
        _config("tests/layers"),
        _config("tests/layers/test_linear.py::test_row_parallel_matches_linear"),
        _config("tests", "tests/layers"),
        _config("tests", keyword="linear"),
        _config("tests", markexpr="slow"),
        _config("tests", workerinput={"workerid": "gw0"}),  # an xdist worker
    ],
    ids=["folder", "one case", "two paths", "-k", "-m slow", "worker"],
)
def test_a_partial_run_is_not_held(config: Any) -> None:
    assert held_budget(config) is None


def test_the_budget_is_in_units_of_the_reference_timed_before_and_after() -> None:
    """The same suite on a machine twice as slow takes twice the minutes and the same units."""
    quick = Held("the full suite", 300.0, before=5.0, after=7.0, took=1500.0)
    slow = Held("the full suite", 300.0, before=10.0, after=14.0, took=3000.0)
    assert quick.units == slow.units == 250.0 and not quick.over and not slow.over
    assert "took 50.0 min = 250 x the reference workload (10.0 s before" in slow.line()
    assert "within its budget of 300 x" in slow.line()
    grown = Held("the full suite", 300.0, before=5.0, after=7.0, took=1860.0)  # 310 units
    assert grown.over and "OVER its budget of 300 x" in grown.line()


@pytest.mark.slow  # a fresh interpreter importing torch: about 6 s
def test_the_reference_workload_runs_in_seconds() -> None:
    assert 0.5 < reference_seconds() < 120


def test_the_quick_tiers_list_names_tests_that_exist_and_no_sweep() -> None:
    """Every id in tests/quick_tier.py names a test function of its file, and none is a sweep's
    (a sweep's first case stays in the quick tier: tests/budget.py)."""
    import ast

    from tests.quick_tier import OVER_THE_LIMIT

    root = TESTS.parent
    wrong = []
    for nodeid in sorted(OVER_THE_LIMIT):
        path, name = nodeid.split("::")[0], nodeid.split("::")[1].split("[")[0]
        tree = ast.parse((root / path).read_text()) if (root / path).is_file() else ast.Module()
        found = [n for n in getattr(tree, "body", []) if isinstance(n, ast.FunctionDef)]
        test = next((n for n in found if n.name == name), None)
        if test is None or any("sweep" in ast.unparse(d) for d in test.decorator_list):
            wrong.append(nodeid)
    assert not wrong, wrong
