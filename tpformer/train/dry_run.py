"""A dry run: the real training step of one rank of a job of any size, traced on this CPU.

The rank's ParallelContext is built on PyTorch's `fake` process-group backend (every
collective completes at once, for any world size), the model, the engine and every batch on the
`meta` device (shapes and dtypes, no storage), and two real steps run through the trainer as
the accelerator runs them: parallel.rng=fast, the generic collective paths (gloo_shortcuts off),
synthetic batches of the configured shapes. What the rank holds and does is measured from the
real objects: parameters, gradients and optimizer state (the engine's memory_report); the
activations held when each backward is called, the engine's working buffers, the forward and
backward's peak and FLOPs (planner/measure.StepMeter); the calls and bytes of each collective
per process group. Any operation that reads a device value on the host raises on meta, so a
dry run also proves the step never waits for the device.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from tpformer.config.schema import Config, DataSource, FinetuneConfig, Logger, ParallelConfig
from tpformer.data.steps import prepare_step
from tpformer.engine.step_runner import PipeDreamStepRunner
from tpformer.parallel.comm import count_collectives
from tpformer.parallel.context import ParallelContext
from tpformer.parallel.fake_world import fake_world
from tpformer.parallel.layout import Layout
from tpformer.planner.measure import StepMeter

META = torch.device("meta")
STEPS = 2
MAX_WARMUP = 64
"""PipeDream: steps run before the metered ones at most, waiting for the stage's first update."""


@dataclass
class DryRun:
    """What one rank of the layout holds and does over a step (bytes, FLOPs)."""

    rank: int
    stage: int
    params: int
    grads: int
    optimizer: int
    activations: int
    """The most the step's operators hold when a backward is called: what the forwards in
    flight keep for backward."""
    buffers: int
    """The engine's working buffers at their most (engine.working_bytes)."""
    step_peak: int
    """Peak of what the forward and backward allocate beyond the model state: activations,
    temporaries, the engine's buffers and the communication buffers they create (the update,
    whose AdamW runs in plain ops on meta but fused on an accelerator, is left out)."""
    flops_per_step: float
    collectives: dict[str, tuple[int, float]] = field(default_factory=dict)
    """{"op group": (calls per step, bytes this rank sends per step)}."""
    seconds: float = 0.0


def ranks_to_run(given: list[int], layout: Layout, key: str) -> list[int]:
    """The ranks a dry run measures: `given`, or the first rank of the first and of the last
    pipeline stage; a rank outside the job is refused, naming `key`."""
    world = layout.world_size
    ranks = list(given) or sorted({0, layout.rank_of(layout.pp - 1, 0, 0)})
    bad = [r for r in ranks if not 0 <= r < world]
    if bad:
        raise ValueError(f"{key}={bad}: a job of {world} ranks has ranks 0-{world - 1}")
    return ranks


def _quiet(parallel: ParallelConfig, trainer: Any) -> tuple[ParallelConfig, Any]:
    """A dry run's parallel and trainer keys: fast randomness, the generic collectives (as on
    an accelerator), nothing logged or written."""
    return (
        replace(parallel, rng="fast", gloo_shortcuts=False),  # type: ignore[arg-type]
        replace(trainer, loggers=list[Logger](), progress=False, save_every=0, async_save=False),
    )


def dry_config(config: Config) -> Config:
    """The pretraining run as a dry run takes it: synthetic batches of its shapes, two steps."""
    parallel, trainer = _quiet(config.parallel, replace(config.trainer, max_steps=STEPS))
    data = replace(config.data, source=DataSource.synthetic, num_workers=0)
    return replace(config, parallel=parallel, data=data, trainer=trainer)


def dry_run(config: Config, world_size: int, rank: int, *, cut_short: bool = True) -> DryRun:
    """Two pretraining steps of `rank` of a `world_size`-rank job of `config` on meta and the
    fake backend. Under 1F1B with more micro-batches than `repeats_from` (and `cut_short`),
    measured at that many and one more, and extended along the line the two draw
    (tests/train/test_dry_run.py holds it equal to the full run to the byte)."""
    from tpformer.train.pretraining import pretraining_trainer

    config = dry_config(config)

    def measured(micro_batches: int) -> DryRun:
        run = replace(config, trainer=replace(config.trainer, grad_accum=micro_batches))
        return _dry_run(
            lambda ctx, run_dir: pretraining_trainer(run, ctx, run_dir),
            run.parallel,
            world_size,
            rank,
        )

    micro_batches = config.trainer.grad_accum
    first = repeats_from(config.parallel)
    if not cut_short or first is None or micro_batches <= first + 1:
        return measured(micro_batches)
    return extended(measured(first), measured(first + 1), micro_batches - first)


def dry_run_finetune(config: FinetuneConfig, world_size: int, rank: int) -> DryRun:
    """Two fine-tuning steps of `rank` of a `world_size`-rank job of `config`: its model (the
    init's shape, no weights read onto meta) and its task's real batches."""
    from tpformer.train.finetuning import finetuning_trainer

    parallel, trainer = _quiet(config.parallel, config.trainer)
    config = replace(config, parallel=parallel, trainer=trainer)
    return _dry_run(
        lambda ctx, run_dir: finetuning_trainer(config, ctx, run_dir),
        config.parallel,
        world_size,
        rank,
    )


def repeats_from(parallel: ParallelConfig) -> int | None:
    """The micro-batch count from which each further micro-batch of a step adds the same work
    to every rank and the same few bytes to what it holds, or None where that is not so. 1F1B
    (and plain accumulation, pipeline=1) holds at most `pipeline` micro-batches in flight on
    any stage: past pipeline + 1 micro-batches (one of them in the steady 1F1B phase on every
    stage) a micro-batch adds one forward, one backward and their collectives, and the peak
    grows only by the loss and count tensors the step keeps to its end.
    GPipe holds every micro-batch, the interleaved schedule's phases depend on the count, and
    PipeDream's stream carries micro-batches across steps: those run in full."""
    if parallel.pipeline_schedule != "1f1b" or not isinstance(parallel.pipeline, int):
        return None
    return parallel.pipeline + 1


def extended(short: DryRun, longer: DryRun, more: int) -> DryRun:
    """`short` (n micro-batches) with `more` micro-batches added at what one more added in
    `longer` (n + 1): FLOPs, each group's calls and bytes, and the few bytes per micro-batch
    the step keeps to its end (its loss and count tensors) in the activations and the peak.
    The model state and the engine's buffers do not grow with micro-batches."""
    state = ("params", "grads", "optimizer", "buffers")
    changed = [k for k in state if getattr(short, k) != getattr(longer, k)]
    if changed or short.collectives.keys() != longer.collectives.keys():
        raise RuntimeError(
            f"the dry run's step does not repeat from {short} to {longer} ({changed}): run it "
            "in full (dry_run(..., cut_short=False))"
        )

    def line(a: float, b: float) -> float:
        return a + (b - a) * more

    collectives = {
        key: (
            round(line(calls, longer.collectives[key][0])),
            line(sent, longer.collectives[key][1]),
        )
        for key, (calls, sent) in short.collectives.items()
    }
    return replace(
        short,
        activations=round(line(short.activations, longer.activations)),
        step_peak=round(line(short.step_peak, longer.step_peak)),
        flops_per_step=line(short.flops_per_step, longer.flops_per_step),
        collectives=collectives,
        seconds=short.seconds + longer.seconds,
    )


def _dry_run(
    build: Callable[[ParallelContext, Path], Any],
    p: ParallelConfig,
    world_size: int,
    rank: int,
) -> DryRun:
    """`build(ctx, run_dir)`'s trainer for `rank` on the fake backend and meta, measured."""
    started = time.perf_counter()
    if not isinstance(p.tensor, int) or not isinstance(p.pipeline, int):
        raise ValueError(
            f"a dry run runs one layout: give parallel.tensor and parallel.pipeline as integers "
            f"(got {p.tensor}, {p.pipeline}; tpformer-plan without plan.dry_run chooses them)"
        )
    with fake_world(rank, world_size):
        ctx = ParallelContext.create(
            p.tensor,
            p.data,
            device=META,
            rng="fast",
            gloo_shortcuts=False,
            sequence_parallel=p.sequence_parallel,
            pipeline=int(p.pipeline),
            context=p.context,
        )
        with tempfile.TemporaryDirectory() as run_dir:
            report = _measure(build(ctx, Path(run_dir)), ctx)
    report.seconds = time.perf_counter() - started
    return report


def _measure(trainer: Any, ctx: ParallelContext) -> DryRun:
    """The last of STEPS steps measured: its model state after backward (gradients) and after
    the update (optimizer state), its forward and backward's allocations and FLOPs, and the
    whole step's collectives. PipeDream's stream carries micro-batches (their activations and
    stashed weights) from one step into the next: its steps run until this stage's first update
    made the optimizer state, then ceil(p / m) + 1 are metered, so what the earlier ones left
    in flight (p - r micro-batches) is counted, and the FLOPs and collectives are the last's."""
    engine = trainer.engine
    asynchronous = isinstance(trainer.runner, PipeDreamStepRunner)
    step = 0

    def run(meter: StepMeter | None = None) -> None:
        nonlocal step
        prepared = _prepared(trainer, step)
        if meter is None:
            trainer.queue_step(prepared, train=True)
        else:
            with meter:  # forward and backward: the update runs AdamW in plain ops on meta,
                # whose temporaries the fused kernel of an accelerator does not allocate
                trainer.queue_step(prepared, train=True)
        step += 1

    for _ in range(STEPS - 1):
        run()
        trainer.runner.update()
    meter = StepMeter(engine.working_bytes)
    if asynchronous:
        while not engine.memory_report().optimizer and step < MAX_WARMUP:
            run()
        stream = trainer.runner.pipedream
        for _ in range(-(-stream.stage.stages // stream.micro)):  # until the stream is full
            run(meter)
        meter.flops = 0
    with count_collectives() as counts:
        run(meter)
        grads = engine.memory_report().grads
        trainer.runner.update()
    state = engine.memory_report()
    return DryRun(
        rank=ctx.rank,
        stage=ctx.pp.rank,
        params=state.params,
        grads=max(grads, state.grads),
        optimizer=state.optimizer,
        activations=meter.held,
        buffers=meter.buffers,
        step_peak=meter.peak,
        flops_per_step=float(meter.flops),
        collectives={k: (n, counts.group_bytes[k]) for k, n in sorted(counts.by_group.items())},
    )


def _prepared(trainer: Any, step: int) -> Any:
    return prepare_step(trainer.task.train_batches, trainer.task.objective, step)
