"""Labelled regions of a step in a torch.profiler trace (trainer.profile): `region("forward")`
spans a part of the step, `mark("all_reduce tp")` labels the collective issued next (callers
that build the label check `recording()` first). Both cost
one check when no profiler is recording, and are skipped inside a graph torch.compile captures
(a label would break it; the compiled region shows as its own kernels)."""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext

import torch

PREFIX = "tpformer/"
"""Every label starts with it, so a trace viewer's search finds tpformer's own regions."""


def recording() -> bool:
    """Whether a profiler records here (outside a graph torch.compile captures)."""
    return not torch.compiler.is_compiling() and torch.autograd._profiler_enabled()


def region(name: str) -> AbstractContextManager[object]:
    """A span named tpformer/<name> in the trace while a profiler records; else nothing."""
    return torch.profiler.record_function(PREFIX + name) if recording() else nullcontext()


def mark(name: str) -> None:
    """An instant label tpformer/<name> (a span of no length) at this point of the trace."""
    if recording():
        with torch.profiler.record_function(PREFIX + name):
            pass
