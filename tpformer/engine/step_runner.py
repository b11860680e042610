"""One step's micro-batch loop, local or pipelined: the one place that keys dropout, sets the
step's mask width, runs forward and backward (the DP reduction on the last micro-batch) and
sums the objective's values on the device.

`parallelize` builds the runner that fits the layout; the training loop only hands it a
prepared step (data/steps.py) and the DP-summed counts, and gets device totals back: nothing
here reads a device value on the host, so a step is queued without waiting for the device.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch
from torch import Tensor, nn

from tpformer.engine.engine import ZeroEngine
from tpformer.parallel.comm import all_reduce
from tpformer.parallel.context import ParallelContext
from tpformer.parallel.pipeline.runner import PipelineRunner

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


class LocalStepRunner:
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
            with torch.set_grad_enabled(train):
                values = objective(self.model, batch, counts)
            if train:  # values[0] is this rank's share of the global mean: the engine sums
                self.engine.backward(values[0], sync=i == len(parts) - 1)
            totals += torch.stack([v.detach().double() for v in values])
        return totals


class PipelineStepRunner:
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
        return all_reduce(totals, self.ctx.pp)  # the values live on the last stage
