"""On CI a test skipped because an optional package is missing (`pytest.importorskip`) fails
instead: .ci/run installs every extra the tests use, so such a skip means a test silently
stopped running there (megatron-core, for one, installs only below Python 3.12). Elsewhere the
skip stays a skip, with its reason. Loaded by tests/conftest.py."""

from __future__ import annotations

import os
from collections.abc import Generator

import pytest

IMPORT_SKIP = "could not import"
"""The start of the reason pytest.importorskip gives."""


def _on_ci() -> bool:
    return os.environ.get("CI", "").lower() in {"1", "true", "yes"}


def _import_skip(report: pytest.CollectReport | pytest.TestReport) -> str | None:
    """The reason of a skip for a missing package, or None."""
    if not report.skipped or not isinstance(report.longrepr, tuple):
        return None
    reason = str(report.longrepr[2]).removeprefix("Skipped: ")
    return reason if reason.startswith(IMPORT_SKIP) else None


def _fail_on_ci(report: pytest.CollectReport | pytest.TestReport) -> None:
    reason = _import_skip(report)
    if reason is not None and _on_ci():
        report.outcome = "failed"
        report.longrepr = f"{reason}: CI installs every optional package the tests use"


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> Generator[None, object, object]:
    report = yield
    assert isinstance(report, pytest.CollectReport)
    _fail_on_ci(report)
    return report


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, object, object]:
    report = yield
    assert isinstance(report, pytest.TestReport)
    _fail_on_ci(report)
    return report
