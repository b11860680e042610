"""Shared test settings."""

import torch

import tests.inductor_settings  # noqa: F401  (inductor's settings for the compiled runs)
from tests.budget import (
    pytest_collection_modifyitems,
    pytest_sessionfinish,
    pytest_terminal_summary,
)

torch.set_num_threads(1)

# the suite's tiers and time budget (tests/budget.py)
__all__ = ["pytest_collection_modifyitems", "pytest_sessionfinish", "pytest_terminal_summary"]
