"""The suite's time budget: the whole suite and the quick tier each fail the run when they take
longer than their budget on CI's machine (2 cores), so the submission that makes the proof slow
is the one that notices. Loaded by tests/conftest.py; docs/testing.md states the budgets.

Only whole-suite runs are held (no -k, no --deselect, the tests/ folder as the only path): the
quick tier is `-m "not slow"`, everything else is the full suite. A run of one file or one case
is never held. With pytest-xdist the controller holds it (its wall clock covers the workers)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

FULL_BUDGET_S = 26 * 60.0
"""The whole suite on CI's 2-core machine: measured 20.9-21.4 min (2026-11-28, 1,318 tests, a
cold inductor cache), with 20% for the machine's drift (runs of the same code vary by 10-25%).
Above the 20 minutes we aim for: lower it as the suite gets there, never raise it to make a
slow change pass."""
QUICK_BUDGET_S = 5 * 60.0
"""`-m "not slow"` on the same machine: measured 4.5 min (2026-11-28, 849 tests; 3.9 min with
832 tests a round earlier)."""
BUDGETS = {"": ("the full suite", FULL_BUDGET_S), "not slow": ("the quick tier", QUICK_BUDGET_S)}
TESTS = Path(__file__).resolve().parent

_started = time.monotonic()


def held_budget(config: pytest.Config) -> tuple[str, float] | None:
    """(name, seconds) of the budget this run is held to, or None for a partial run."""
    option = config.option
    if getattr(config, "workerinput", None) is not None:  # an xdist worker: the controller holds
        return None
    partial = (option.keyword, getattr(option, "deselect", None), getattr(option, "lf", False))
    if any(partial):
        return None
    paths = [Path(arg.split("::")[0]).resolve() for arg in config.args]
    if paths != [TESTS]:
        return None
    return BUDGETS.get(option.markexpr.strip())


def pytest_terminal_summary(
    terminalreporter: pytest.TerminalReporter, exitstatus: int, config: pytest.Config
) -> None:
    budget = held_budget(config)
    if budget is None:
        return
    name, limit = budget
    took = time.monotonic() - _started
    verdict = "within" if took <= limit else "OVER"
    terminalreporter.write_line(
        f"time budget: {name} took {took / 60:.1f} min, {verdict} its budget of "
        f"{limit / 60:.0f} min (tests/budget.py)",
        red=took > limit,
        bold=True,
    )


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    budget = held_budget(session.config)
    if budget is None:
        return
    if time.monotonic() - _started > budget[1] and session.exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.hookimpl(tryfirst=True)  # before -m deselects by the marks given here
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A test marked `sweep` (a layout or case sweep) runs its first case in the quick tier and
    the rest in the slow tier: the inner loop still meets every sweep once."""
    seen: set[tuple[str, str]] = set()
    for item in items:
        if item.get_closest_marker("sweep") is None:
            continue
        key = (str(item.path), getattr(item, "originalname", item.name))
        if key in seen:
            item.add_marker(pytest.mark.slow)
        seen.add(key)
