"""The one assembly: the parallel wrappers applied to a built model, in a fixed order.

Every entry point, tool and benchmark builds its engine through `parallelize`, so a wrapper added
here (later: sequence parallelism, pipeline stages) reaches all of them at once. Order:

1. activation recomputation wraps the model's blocks (before the engine, whose stage-3 hooks
   must see the recomputed forward as a forward inside backward, and skip the free);
2. the engine takes over the parameters (flat buffers, ZeRO partitioning, precision, offload)
   and builds the optimizer over them.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from tpformer.config.schema import OptimConfig, ParallelConfig
from tpformer.engine.engine import ZeroEngine
from tpformer.engine.recompute import apply_recompute
from tpformer.parallel.context import ParallelContext


@dataclass
class Parallelized:
    """What `parallelize` made of a model."""

    engine: ZeroEngine
    recomputed: list[str]
    """Names of the modules (full) or methods (selective) that recompute in backward."""


def build_engine(model: nn.Module, optim: OptimConfig, parallel: ParallelConfig,
                 ctx: ParallelContext) -> ZeroEngine:
    """The engine for parallel.zero_stage / cpu_offload / precision, over ctx's DP group."""
    return ZeroEngine(model, optim, ctx, zero_stage=parallel.zero_stage,
                      cpu_offload=parallel.cpu_offload, precision=parallel.precision,
                      grad_compression=parallel.grad_compression,
                      powersgd_rank=parallel.powersgd_rank,
                      powersgd_start_step=parallel.powersgd_start_step)


def parallelize(model: nn.Module, parallel: ParallelConfig, optim: OptimConfig,
                ctx: ParallelContext) -> Parallelized:
    """Apply recomputation, then the engine, to a model built at ctx's TP degree."""
    recomputed = apply_recompute(model, parallel, ctx.rng)
    return Parallelized(build_engine(model, optim, parallel, ctx), recomputed)
