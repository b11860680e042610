"""Wraps a built model and its optimizer: data parallelism, ZeRO 1-3, offload, precision,
activation checkpointing. It imports no layer or model: a model names its blocks."""

from __future__ import annotations

from tpformer.engine.engine import ZeroEngine
from tpformer.engine.parallelize import Parallelized, build_engine, parallelize

__all__ = ["Parallelized", "ZeroEngine", "build_engine", "parallelize"]
