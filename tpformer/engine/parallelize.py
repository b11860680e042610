"""The one assembly: the parallel wrappers applied to a built model, in a fixed order.

Every entry point, tool and benchmark builds its engine through `parallelize`, so a wrapper added
here reaches all of them at once. Order:

1. pipeline parallelism (parallel.pipeline > 1) keeps this rank's stage of the model: the split,
   chosen before (planner/split.plan_pipeline), says which blocks, and every other stage's
   parameters are dropped;
2. trainer.compile: each remaining block's forward is torch.compile'd (engine/compiled.py);
   activation recomputation then wraps the blocks (before the engine, whose stage-3 hooks
   must see the recomputed forward as a forward inside backward, and skip the free); with
   compile, the methods marked eager (exact mode's dropout draws, selective recomputation's
   wrapper, ring attention) are then kept out of the graphs;
3. the engine takes over the parameters (flat buffers, ZeRO partitioning, precision, offload)
   and builds the optimizer over them; the pipeline runner gets the engine's compute dtype;
4. the step runner (engine/step_runner.py): the micro-batch loop of a step, local or pipelined.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

from torch import nn

from tpformer.config.schema import OptimConfig, ParallelConfig
from tpformer.engine.compiled import apply_compile, isolate_eager_islands
from tpformer.engine.engine import ZeroEngine
from tpformer.engine.recompute import apply_recompute
from tpformer.engine.step_runner import (
    LocalStepRunner,
    PipeDreamStepRunner,
    PipelineStepRunner,
    StepRunner,
)
from tpformer.parallel.context import ParallelContext
from tpformer.parallel.pipeline.runner import PipelineRunner
from tpformer.parallel.pipeline.stage import PipelineStage, build_stage, pipelined


@dataclass
class Parallelized:
    """What `parallelize` made of a model."""

    engine: ZeroEngine
    runner: StepRunner
    """The micro-batch loop of one step at this layout (what the training loop calls)."""
    recomputed: list[str]
    """Names of the modules (full) or methods (selective) that recompute in backward."""
    pipeline: PipelineRunner | None = None
    """This rank's pipeline stage and schedule (parallel.pipeline > 1)."""


def build_engine(
    model: nn.Module, optim: OptimConfig, parallel: ParallelConfig, ctx: ParallelContext
) -> ZeroEngine:
    """The engine for parallel.zero_stage / cpu_offload / precision, over ctx's DP group."""
    return ZeroEngine(
        model,
        optim,
        ctx,
        zero_stage=parallel.zero_stage,
        cpu_offload=parallel.cpu_offload,
        precision=parallel.precision,
        grad_compression=parallel.grad_compression,
        powersgd_rank=parallel.powersgd_rank,
        powersgd_start_step=parallel.powersgd_start_step,
        independent_stages=parallel.pipeline_schedule == "pipedream",
        bucket_mb=parallel.bucket_mb,
    )


def _step_runner(
    model: nn.Module,
    stage: PipelineStage | None,
    engine: ZeroEngine,
    parallel: ParallelConfig,
    ctx: ParallelContext,
) -> tuple[PipelineRunner | None, StepRunner]:
    """The step's micro-batch loop at this layout: local, a flushed pipeline schedule, or
    PipeDream's asynchronous one (with the pipeline runner, when there is one)."""
    if stage is None:
        return None, LocalStepRunner(model, engine, ctx)
    hidden = cast(Any, model).config.hidden_size  # pipelined models name their ModelConfig
    if parallel.pipeline_schedule == "pipedream":
        pipedream = PipeDreamStepRunner(
            stage,
            engine,
            ctx,
            hidden=hidden,
            vertical_sync=parallel.pipedream_vertical_sync,
            every_step=parallel.pipedream_update == "step",
        )
        return pipedream.pipedream, pipedream
    flushed = PipelineRunner(
        stage, ctx, schedule=parallel.pipeline_schedule, hidden=hidden, dtype=engine.dtype
    )
    return flushed, PipelineStepRunner(flushed, engine, ctx)


def parallelize(
    model: nn.Module,
    parallel: ParallelConfig,
    optim: OptimConfig,
    ctx: ParallelContext,
    *,
    split: list[int] | None = None,
    compile_blocks: bool = False,
) -> Parallelized:
    """Keep this rank's pipeline stage (`split`: layers per virtual stage, the planner's
    choice, needed when ctx has pipeline stages), compile its blocks (`compile_blocks`,
    trainer.compile), apply recomputation, then the engine, to a model built at ctx's TP
    degree."""
    stage = None
    stages = ctx.layout.pp
    if stages > 1:
        if split is None:
            raise ValueError(
                f"a pipeline of {stages} stages needs the layers of each: pass split= "
                "(planner/split.plan_pipeline chooses it for parallel.pipeline_split)"
            )
        pipelined(model)  # what the stages call, checked before anything is split
        stage = build_stage(
            model,
            split,
            ctx.stage,
            stages,
            tie_ends=parallel.pipeline_schedule != "pipedream",
        )
    if compile_blocks:
        apply_compile(model, ctx.rng)
    recomputed = apply_recompute(model, parallel, ctx.rng)
    if compile_blocks:
        isolate_eager_islands(model)
    engine = build_engine(model, optim, parallel, ctx)
    runner, steps = _step_runner(model, stage, engine, parallel, ctx)
    return Parallelized(engine, steps, recomputed, runner)
