"""One step's micro-batch loop, local or pipelined: the one place that keys dropout, sets the
step's mask width, runs forward and backward (the DP reduction on the last micro-batch) and
sums the objective's values on the device.

`parallelize` builds the runner that fits the layout; the training loop only hands it a
prepared step (data/steps.py) and the DP-summed counts, and gets device totals back: nothing
here reads a device value on the host, so a step is queued without waiting for the device.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import torch
from torch import Tensor, nn

from tpformer.engine.engine import ZeroEngine
from tpformer.parallel.comm import all_reduce
from tpformer.parallel.context import ParallelContext
from tpformer.parallel.pipeline.pipedream import PipeDreamRunner
from tpformer.parallel.pipeline.runner import PipelineRunner
from tpformer.parallel.pipeline.stage import PipelineStage
from tpformer.parallel.regions import region

Batch = dict[str, Tensor]


class StepObjective(Protocol):
    """What a runner needs of an Objective (train/objectives.py)."""

    names: tuple[str, ...]

    def model_inputs(self, batch: Batch) -> Batch: ...

    def values(self, out: Any, batch: Batch, counts: Tensor) -> list[Tensor]: ...

    def __call__(self, model: nn.Module, batch: Batch, counts: Tensor) -> list[Tensor]: ...


class StepRunner(Protocol):
    def run(
        self,
        step: int,
        parts: list[tuple[int, Batch]],
        objective: StepObjective,
        counts: Tensor,
        *,
        mask_width: int,
        train: bool,
    ) -> Tensor:
        """Forward (and backward when training) every micro-batch of `step` on this rank;
        returns float64 [len(objective.names)]: this DP rank's share of each global mean, on
        the device, not yet summed over DP."""
        ...

    def update(self) -> dict[str, Tensor]:
        """The step's optimizer update (grad_norm and skipped as device scalars)."""
        ...

    def drain(self) -> None:
        """Finish what the step left in flight (pipedream's owed backwards) before a
        checkpoint, the last evaluation or the end."""
        ...

    def outputs(self, batch: Batch, extract: Callable[[Any], Tensor]) -> Tensor:
        """Forward one batch without gradients and return `extract` of the model's output on
        every rank (prediction; through the stages from the last one when pipelined)."""
        ...


class _StepUpdate:
    """One optimizer update after every step, nothing left in flight."""

    engine: ZeroEngine

    def update(self) -> dict[str, Tensor]:
        with region("optimizer"):
            return self.engine.queue_step()

    def drain(self) -> None:
        return None


class LocalStepRunner(_StepUpdate):
    """The whole model on this rank: micro-batches one after another."""

    def __init__(self, model: nn.Module, engine: ZeroEngine, ctx: ParallelContext) -> None:
        self.model, self.engine, self.ctx = model, engine, ctx

    def run(
        self,
        step: int,
        parts: list[tuple[int, Batch]],
        objective: StepObjective,
        counts: Tensor,
        *,
        mask_width: int,
        train: bool,
    ) -> Tensor:
        rng = self.ctx.rng
        rng.mask_width = mask_width
        totals = torch.zeros(len(objective.names), dtype=torch.float64, device=self.ctx.device)
        for i, (key, batch) in enumerate(parts):
            rng.set_position(step, key)
            with torch.set_grad_enabled(train), region(f"forward {i}"):
                values = objective(self.model, batch, counts)
            if train:  # values[0] is this rank's share of the global mean: the engine sums
                with region(f"backward {i}"):
                    self.engine.backward(values[0], sync=i == len(parts) - 1)
            totals += torch.stack([v.detach().double() for v in values])
        return totals

    @torch.no_grad()
    def outputs(self, batch: Batch, extract: Callable[[Any], Tensor]) -> Tensor:
        return extract(self.model(**batch))


class PipelineStepRunner(_StepUpdate):
    """This rank's pipeline stage: the micro-batches go through the stage's schedule."""

    def __init__(self, pipeline: PipelineRunner, engine: ZeroEngine, ctx: ParallelContext) -> None:
        self.pipeline, self.engine, self.ctx = pipeline, engine, ctx

    def _backward(self, t: Tensor, grad: Tensor | None, sync: bool) -> None:
        self.engine.backward(t, sync=sync, grad=grad)

    def run(
        self,
        step: int,
        parts: list[tuple[int, Batch]],
        objective: StepObjective,
        counts: Tensor,
        *,
        mask_width: int,
        train: bool,
    ) -> Tensor:
        self.ctx.rng.mask_width = mask_width
        self.engine.settle()  # the stages call the model's parts, not its forward (hooks)
        totals = self.pipeline.run(
            step,
            [(key, objective.model_inputs(b)) for key, b in parts],
            lambda out, b: objective.values(out, b, counts),
            len(objective.names),
            self._backward,
            train=train,
        )
        totals = all_reduce(totals, self.ctx.pp)  # the values live on the last stage
        if self.ctx.layout.stage_workers:  # ctx.pp is the world: the sum over every replica already
            totals /= self.ctx.replicas.size  # this replica's share (the loop sums them)
        return totals

    def outputs(self, batch: Batch, extract: Callable[[Any], Tensor]) -> Tensor:
        return self.pipeline.outputs(batch, extract)


class PipeDreamStepRunner(PipelineStepRunner):
    """The pipedream schedule: the stage updates inside the step (after its own backwards) and
    carries in-flight micro-batches into the next step; `update` reports this stage's last
    update of the step (the first stage's grad_norm is the one logged)."""

    def __init__(
        self,
        stage: PipelineStage,
        engine: ZeroEngine,
        ctx: ParallelContext,
        *,
        hidden: int,
        vertical_sync: bool,
        every_step: bool,
    ) -> None:
        pipeline = PipeDreamRunner(
            stage,
            ctx,
            self,
            hidden=hidden,
            dtype=engine.dtype,
            vertical_sync=vertical_sync,
            every_step=every_step,
        )
        super().__init__(pipeline, engine, ctx)
        self.pipedream = pipeline
        zero = torch.zeros((), dtype=torch.float64, device=ctx.device)
        self.status: dict[str, Tensor] = {"grad_norm": zero, "skipped": zero}

    def add_gradients(self, grads: list[tuple[nn.Parameter, Tensor]], *, sync: bool) -> None:
        self.engine.add_gradients(grads, sync=sync)

    def update(self) -> dict[str, Tensor]:
        """The step's updates already ran inside it: the status of this stage's last one."""
        return self.status

    def apply_update(self) -> None:
        self.status = self.engine.queue_step()
        self.engine.settle()  # the next forward copies the live weights

    def drain(self) -> None:
        self.pipedream.drain()
