"""A dry run: the real training step of one rank of a job of any size, traced on this CPU.

The rank's ParallelContext is built on PyTorch's `fake` process-group backend (every
collective completes at once, for any world size), the model, the engine and every batch on the
`meta` device (shapes and dtypes, no storage), and two real steps run through the trainer as
the accelerator runs them: parallel.rng=fast, the generic collective paths (gloo_shortcuts off),
synthetic batches of the configured shapes. What the rank holds and does is measured from the
real objects: parameters, gradients and optimizer state (the engine's memory_report), the peak
of everything else the step allocates (activations and temporaries, from the storages the
step's operators create and free), the FLOPs (FlopCounterMode) and the calls and bytes of each
collective per process group. Any operation that reads a device value on the host raises on
meta, so a dry run also proves the step never waits for the device.
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch

from tpformer.config.schema import Config, DataSource, Logger
from tpformer.data.steps import prepare_step
from tpformer.parallel.comm import count_collectives
from tpformer.parallel.context import ParallelContext
from tpformer.parallel.fake_world import fake_world
from tpformer.planner.measure import StepMeter

META = torch.device("meta")
STEPS = 2


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
    """Peak of what the step allocates beyond the model state: activations, temporaries,
    the engine's buffers and the communication buffers it creates."""
    flops_per_step: float
    collectives: dict[str, tuple[int, float]] = field(default_factory=dict)
    """{"op group": (calls per step, bytes this rank sends per step)}."""
    seconds: float = 0.0

    @property
    def total(self) -> int:
        return self.params + self.grads + self.optimizer + self.step_peak


def dry_config(config: Config) -> Config:
    """The run as a dry run takes it: synthetic batches of its shapes, fast randomness, the
    generic collectives, nothing written."""
    return replace(
        config,
        parallel=replace(config.parallel, rng="fast", gloo_shortcuts=False),  # type: ignore[arg-type]
        data=replace(config.data, source=DataSource.synthetic, num_workers=0),
        trainer=replace(
            config.trainer,
            max_steps=STEPS,
            loggers=list[Logger](),
            progress=False,
            save_every=0,
            async_save=False,
        ),
    )


def dry_run(config: Config, world_size: int, rank: int) -> DryRun:
    """Two steps of `rank` of a `world_size`-rank job of `config` on meta and the fake backend."""
    from tpformer.train.pretraining import pretraining_trainer

    started = time.perf_counter()
    config = dry_config(config)
    p = config.parallel
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
            trainer = pretraining_trainer(config, ctx, Path(run_dir))
            report = _measure(trainer, ctx)
    report.seconds = time.perf_counter() - started
    return report


def _measure(trainer: Any, ctx: ParallelContext) -> DryRun:
    """The last of STEPS steps measured: its model state after backward (gradients) and after
    the update (optimizer state), its peak allocations, FLOPs and collectives."""
    engine = trainer.engine
    for step in range(STEPS - 1):
        trainer.queue_step(_prepared(trainer, step), train=True)
        trainer.runner.update()
    prepared = _prepared(trainer, STEPS - 1)
    meter = StepMeter(engine.working_bytes)
    with count_collectives() as counts, meter:
        trainer.queue_step(prepared, train=True)
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
