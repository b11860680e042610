"""tests/budget.py holds whole-suite runs to their budget and leaves partial runs alone."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from tests.budget import FULL_BUDGET_S, QUICK_BUDGET_S, TESTS, held_budget


def _config(*args: str, markexpr: str = "", keyword: str = "", **extra: Any) -> Any:
    option = SimpleNamespace(markexpr=markexpr, keyword=keyword, deselect=None, lf=False)
    return SimpleNamespace(option=option, args=list(args), **extra)


def test_the_whole_suite_and_the_quick_tier_are_held() -> None:
    assert held_budget(_config("tests")) == ("the full suite", FULL_BUDGET_S)
    assert held_budget(_config(str(TESTS))) == ("the full suite", FULL_BUDGET_S)
    quick = held_budget(_config("tests", markexpr="not slow"))
    assert quick == ("the quick tier", QUICK_BUDGET_S)


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
