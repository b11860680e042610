"""Shared test settings."""

import os

# inductor (trainer.compile tests): one compile thread; its worker pool costs more than it
# saves on the 2-core CI machine (cold compile of the test model: 33 s instead of 43 s)
os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")

import torch

from tests.budget import (
    pytest_collection_modifyitems,
    pytest_sessionfinish,
    pytest_terminal_summary,
)

torch.set_num_threads(1)

# the suite's tiers and time budget (tests/budget.py)
__all__ = ["pytest_collection_modifyitems", "pytest_sessionfinish", "pytest_terminal_summary"]
