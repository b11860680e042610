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
import weakref
from dataclasses import dataclass, field, replace
from pathlib import Path
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import flop_registry

from tpformer.config.schema import Config, DataSource, Logger
from tpformer.data.steps import prepare_step
from tpformer.parallel.comm import count_collectives
from tpformer.parallel.context import ParallelContext
from tpformer.parallel.fake_world import fake_world

META = torch.device("meta")
STEPS = 2


class StepMeter(TorchDispatchMode):
    """What the operators inside it allocate and compute.

    live     bytes of the storages they allocated that are still alive (a storage counts from
             the op that allocated it, an output that is no view of an input and not written
             into one, until it is freed)
    held     the most alive when a backward pass is called: what the forwards in flight keep
             for backward (the planner's activations)
    buffers  the most `working()` said: buffers the engine keeps out of the operators' sight
             (pooled gradient buckets, storages resized for a gather)
    peak     the most of live + working at once
    flops    by FlopCounterMode's formulas, without its module tracker, whose backward hooks
             keep every recomputed activation alive to the end of the step
    """

    def __init__(self, working: Callable[[], int] = lambda: 0) -> None:
        super().__init__()
        self.working = working
        self.buffers = 0
        self.live = 0
        self.peak = 0
        self.held = 0
        self.flops = 0
        self._seen: set[int] = set()
        self._backward = torch.autograd.backward

    def __enter__(self) -> StepMeter:
        # every backward (Tensor.backward too) goes through torch.autograd.backward; checkpoint's
        # recomputation inside it runs outside the graph task, so the engine's own state cannot
        # tell where a backward starts
        def backward(*args: Any, **kwargs: Any) -> None:
            self.held = max(self.held, self.live)
            self._sample()
            self._backward(*args, **kwargs)

        torch.autograd.backward = backward  # type: ignore[assignment]
        return super().__enter__()

    def __exit__(self, *exc: Any) -> None:
        torch.autograd.backward = self._backward
        super().__exit__(*exc)

    def _free(self, key: int, nbytes: int) -> None:
        self.live -= nbytes
        self._seen.discard(key)

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        formula = flop_registry.get(func._overloadpacket)
        if formula is not None:
            self.flops += formula(*args, **kwargs, out_val=out)
        outputs = out if isinstance(out, (tuple, list)) else (out,)
        for t, fresh in zip(outputs, _fresh_returns(func, len(outputs)), strict=True):
            if fresh and isinstance(t, torch.Tensor) and t.layout == torch.strided:
                self._allocated(t.untyped_storage())
        return out

    def _allocated(self, storage: torch.UntypedStorage) -> None:
        key = id(storage)
        if key not in self._seen:
            self._seen.add(key)
            self.live += storage.nbytes()
            weakref.finalize(storage, self._free, key, storage.nbytes())
            self._sample()

    def _sample(self) -> None:
        working = self.working()
        self.buffers = max(self.buffers, working)
        self.peak = max(self.peak, self.live + working)


def _fresh_returns(func: Any, count: int) -> list[bool]:
    """Which of an operator's `count` outputs are new storages: those its schema does not
    alias to an input (views, in-place and out= results do). c10d's collectives write into
    tensors they are given, though their schemas do not say so."""
    if func.namespace == "c10d":
        return [False] * count
    returns = func._schema.returns
    if len(returns) == 1 and count != 1:  # one Tensor[] return
        return [returns[0].alias_info is None] * count
    return [r.alias_info is None for r in returns][:count] + [False] * (count - len(returns))


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
