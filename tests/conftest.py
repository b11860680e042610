"""Shared test settings."""

import torch

import tests.inductor_settings  # noqa: F401  (inductor's settings for the compiled runs)
from tests.budget import (
    pytest_collection_modifyitems,
    pytest_sessionfinish,
    pytest_sessionstart,
    pytest_terminal_summary,
)
from tests.optional_imports import pytest_make_collect_report, pytest_runtest_makereport

torch.set_num_threads(1)

# the suite's tiers and time budget (tests/budget.py)
# and a missing optional package fails on CI (tests/optional_imports.py)
__all__ = [
    "pytest_collection_modifyitems",
    "pytest_make_collect_report",
    "pytest_runtest_makereport",
    "pytest_sessionfinish",
    "pytest_sessionstart",
    "pytest_terminal_summary",
]
