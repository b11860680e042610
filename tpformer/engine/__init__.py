"""Wraps a built model and its optimizer: data parallelism, ZeRO 1-3, offload, precision."""

from __future__ import annotations

from torch import nn

from tpformer.config.schema import OptimConfig, ParallelConfig
from tpformer.engine.zero import ZeroEngine
from tpformer.parallel.context import ParallelContext


def build_engine(model: nn.Module, optim: OptimConfig, parallel: ParallelConfig,
                 ctx: ParallelContext) -> ZeroEngine:
    """The engine for parallel.zero_stage / cpu_offload / precision, over ctx's DP group."""
    return ZeroEngine(model, optim, ctx, zero_stage=parallel.zero_stage,
                      cpu_offload=parallel.cpu_offload, precision=parallel.precision)


__all__ = ["ZeroEngine", "build_engine"]
