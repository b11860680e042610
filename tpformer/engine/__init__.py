"""Wraps a built model and its optimizer: data parallelism, ZeRO 1-3, offload, precision,
activation checkpointing. It imports no layer or model: a model names its blocks.

Its names load on first use (PEP 562), so the planner's arithmetic over a model's units
(engine/units.py) does not import the engine and its checkpoint I/O."""

from __future__ import annotations

import importlib
from typing import Any

_FROM = {
    "ZeroEngine": "tpformer.engine.engine",
    "Parallelized": "tpformer.engine.parallelize",
    "build_engine": "tpformer.engine.parallelize",
}
"""(`parallelize` is imported from tpformer.engine.parallelize: the module of that name, once
loaded, is what `from tpformer.engine import parallelize` finds.)"""
__all__ = sorted(_FROM)


def __getattr__(name: str) -> Any:
    if name not in _FROM:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_FROM[name]), name)
