"""The only package that creates, stores or names process groups.

Its names load on first use (PEP 562): the layout arithmetic (parallel/layout.py), which the
config's validation reads, needs no torch, so importing the validator imports none
(tests/test_import_layers.py)."""

from __future__ import annotations

import importlib
from typing import Any

_FROM = {
    "GroupHandle": "tpformer.parallel.handle",
    "ParallelContext": "tpformer.parallel.context",
    "Layout": "tpformer.parallel.layout",
    "divide": "tpformer.parallel.layout",
    "resolve_layout": "tpformer.parallel.layout",
    "shard_range": "tpformer.parallel.layout",
}
__all__ = sorted(_FROM)


def __getattr__(name: str) -> Any:
    if name not in _FROM:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_FROM[name]), name)
