"""PipeDream's asynchronous pipeline on one stage: 1F1B without a flush, weight stashing, vertical
sync, an update after every `every` backwards.

Each forward reads the weight version `schedule.pipedream_version` names; the version is stashed
(a copy of this stage's parameters, taken while it is the live one) and the micro-batch's
backward runs against the same copy, so forward and backward see the same weights although the
stage updated in between. The stashed copies stand in for the parameters inside the modules for
the duration of a forward or backward (recomputation in backward sees them too); their gradients
are handed to the optimizer's owner (`add_gradients`), which applies them to the live weights
(`apply_update`). A copy is dropped as soon as no in-flight micro-batch and no coming forward
reads it: p - r copies on stage r, p with vertical sync (per-micro-batch updates, measured).

Stages share no parameter: a weight the first and the last stage both use (the tied word
embedding) is two copies, each trained by its own stage (a pipeline-wide gradient sum at every
update would make the stages wait for each other, which is what asynchronous training avoids).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Protocol, cast

import torch
from torch import Tensor, nn

from tpformer.parallel.comm import Pending, recv, send_async
from tpformer.parallel.context import ParallelContext
from tpformer.parallel.pipeline.runner import Backward, Batch, PipelineRunner, Values, _grad_of
from tpformer.parallel.pipeline.schedule import (
    Action,
    pipedream_drain,
    pipedream_step,
    pipedream_version,
    replica_backwards_per_update,
)
from tpformer.parallel.pipeline.stage import PipelineStage
from tpformer.parallel.regions import region


class StageOptimizer(Protocol):
    """Who owns this stage's live weights and their optimizer (the engine, via the step runner)."""

    def add_gradients(self, grads: list[tuple[nn.Parameter, Tensor]], *, sync: bool) -> None:
        """Add each parameter's gradient; `sync`: the last before an update (reduce over DP)."""
        ...

    def apply_update(self) -> None:
        """Apply the gradients added since the last update to the live weights."""
        ...


class WeightStash:
    """Copies of this stage's parameters by version, swapped into the modules on request."""

    def __init__(self, model: nn.Module) -> None:
        self.slots = [
            (module, name, param)
            for module in model.modules()
            for name, param in module._parameters.items()
            if param is not None
        ]
        unique: dict[int, nn.Parameter] = {}
        for _, _, param in self.slots:
            unique.setdefault(id(param), param)
        self.params = list(unique.values())
        self.index = {id(p): i for i, p in enumerate(self.params)}
        self.versions: dict[int, list[Tensor]] = {}
        self.peak = self.peak_bytes = 0
        """Most versions held at once, and their bytes (the memory of weight stashing)."""

    def keep(self, version: int) -> None:
        """Copy the live weights as `version` (they must be that version now)."""
        if version not in self.versions:
            self.versions[version] = [
                p.detach().clone().requires_grad_(p.requires_grad) for p in self.params
            ]
            self.peak = max(self.peak, len(self.versions))
            self.peak_bytes = max(self.peak_bytes, self.bytes_held)

    def drop_except(self, needed: set[int]) -> None:
        for version in [v for v in self.versions if v not in needed]:
            del self.versions[version]

    @property
    def bytes_held(self) -> int:
        return sum(t.numel() * t.element_size() for ts in self.versions.values() for t in ts)

    @contextmanager
    def use(self, version: int) -> Iterator[None]:
        """The modules compute with the copy `version` inside the block."""
        tensors = self.versions[version]
        for module, name, param in self.slots:
            module._parameters[name] = tensors[self.index[id(param)]]  # type: ignore[assignment]
        try:
            yield
        finally:
            for module, name, param in self.slots:
                module._parameters[name] = param

    def take_gradients(self, version: int) -> list[tuple[nn.Parameter, Tensor]]:
        """The gradients the last backward left on copy `version`, as (live parameter, grad)."""
        out = []
        for param, copy in zip(self.params, self.versions[version]):
            if copy.grad is not None:
                out.append((param, copy.grad))
                copy.grad = None
        return out


@dataclass
class InFlight:
    """A micro-batch between its forward and its backward on this stage."""

    x: Tensor | None
    y: Tensor
    version: int


class PipeDreamRunner(PipelineRunner):
    """Runs the pipedream schedule: `run` one step's slice of the endless 1F1B stream (the
    in-flight micro-batches carry over to the next step), `drain` the owed backwards.

    `every_step`: update once per trainer.grad_accum micro-batches (else after each one); the
    backward of each micro-batch is scaled by (micro-batches per step / per update), so an
    update's gradient is the mean over its micro-batches as a whole step's would be.

    Replicated stages (ctx.layout.stage_workers): replica j of a stage of n runs the stream's
    micro-batches j, j + n, ... (PipeDream's round robin) as a 1F1B stream of its own, and the
    replicas update together, their gradients summed (the engine's reduction over
    ctx.replicas): an update is n x `every` consecutive micro-batches of the stream. A
    received gradient is rescaled by the stages' ratio of micro-batches per update, so each
    stage's update is still the mean over its own micro-batches."""

    def __init__(
        self,
        stage: PipelineStage,
        ctx: ParallelContext,
        optimizer: StageOptimizer,
        *,
        hidden: int,
        dtype: torch.dtype,
        vertical_sync: bool,
        every_step: bool,
    ) -> None:
        super().__init__(stage, ctx, schedule="pipedream", hidden=hidden, dtype=dtype)
        self.optimizer = optimizer
        self.vertical_sync, self.every_step = vertical_sync, every_step
        self.stash = WeightStash(cast(nn.Module, stage.model))
        self.replicas = ctx.layout.stage_workers
        self.replica = ctx.layout.replica_of(ctx.rank)
        self.workers = self.replicas[stage.rank] if self.replicas else 1
        """Replicas of this stage: it runs every `workers`-th micro-batch."""
        self.steps = 0
        """Steps since the last drain (the stream restarts, from an empty pipeline, at each)."""
        self.micro = 0
        self.forwards = self.updates = 0
        self.in_flight: dict[int, InFlight] = {}
        self.carried: list[Pending] = []
        """Gradient sends whose receiver may post its receive in the next step."""

    # ------------------------------------------------------------------ versions

    @property
    def every(self) -> int:
        """This replica's backwards per update."""
        return replica_backwards_per_update(self.micro, self.workers, every_step=self.every_step)

    def per_update(self, stage: int) -> int:
        """Micro-batches (of the stream) per update of `stage`: grad_accum per step, else one
        per replica (the replicas update together)."""
        return self.micro if self.every_step else (self.replicas[stage] if self.replicas else 1)

    def version_of(self, index: int) -> int:
        return pipedream_version(
            self.stage.stages,
            self.stage.rank,
            index,
            every=self.every,
            vertical_sync=self.vertical_sync,
            replicas=self.replicas,
        )

    def next_forward(self) -> int:
        """The stream number of this replica's next forward."""
        return self.forwards * self.workers + self.replica

    def _tidy_stash(self) -> None:
        """Keep the versions in-flight micro-batches and coming forwards read."""
        coming = self.version_of(self.next_forward())
        needed = {f.version for f in self.in_flight.values()}
        needed |= {v for v in self.stash.versions if v >= coming}
        self.stash.drop_except(needed)

    def _update(self) -> None:
        """Stash the live version first when a coming forward still reads it (vertical sync)."""
        if self.version_of(self.next_forward()) <= self.updates:
            self.stash.keep(self.updates)
        self.optimizer.apply_update()
        self.updates += 1
        self._tidy_stash()

    # ------------------------------------------------------------------ one step

    def _tag_of(self, kind: int, index: int, vstage: int) -> int:
        window = 2 * (self.micro + self.ctx.layout.world_size)  # in-flight numbers span less
        return self._tag(kind, index % window, vstage, window)

    def run(
        self,
        step: int,
        parts: list[tuple[int, Batch]],
        values: Values,
        n_values: int,
        backward: Backward,
        *,
        train: bool,
    ) -> Tensor:
        """As PipelineRunner.run; `backward` is unused: gradients go to the optimizer."""
        if not train:  # evaluation: forwards with the live weights, nothing in flight changes
            return super().run(step, parts, values, n_values, lambda *_: None, train=False)
        if self.steps and len(parts) != self.micro:
            raise ValueError(
                f"pipedream: a step of {len(parts)} micro-batches after steps of {self.micro}; "
                "the stream needs the same trainer.grad_accum every step"
            )
        self.micro = len(parts)
        totals = torch.zeros(n_values, dtype=torch.float64, device=self.ctx.device)
        activations: list[Pending] = []
        gradients: list[Pending] = []
        first = self.steps * self.micro
        for action in pipedream_step(
            self.stage.stages, self.micro, self.stage.rank, self.steps, self.replicas, self.replica
        ):
            with region(f"{action.kind} micro {action.micro}"):
                if action.kind == "F":
                    key, batch = parts[action.micro - first]
                    self._forward(action.micro, step, key, batch, values, totals, activations)
                else:
                    self._backward(action.micro, gradients)
        self.steps += 1
        for work in [*self.carried, *activations]:  # their receivers posted them this step
            work.wait()
        self.carried = gradients  # the previous stage may receive these in the next step
        return totals

    def _forward(
        self,
        index: int,
        step: int,
        key: int,
        batch: Batch,
        values: Values,
        totals: Tensor,
        sends: list[Pending],
    ) -> None:
        stage, p = self.stage, self.stage.stages
        self.ctx.rng.set_position(step, key)
        version = self.version_of(index)
        assert version == self.updates or version in self.stash.versions, "unstashed version"
        self.stash.keep(version)  # the live weights, or a version stashed before its update
        x = None
        if stage.rank > 0:
            x = recv(
                torch.empty(self._shape(batch), dtype=self.dtype, device=self.ctx.device),
                self.prev(index),
                self.activations,
                self._tag_of(0, index, stage.rank),
            )
            x.requires_grad_()
        with self.stash.use(version):
            y = stage.forward(0, x, batch)
            if stage.rank == p - 1:
                vals = values(stage.head(y, batch), batch)
                totals += torch.stack([t.detach().double() for t in vals])
                per_update = self.per_update(stage.rank)
                y = vals[0] * (self.micro / per_update) if per_update != self.micro else vals[0]
        self.in_flight[index] = InFlight(x, y, version)
        self.forwards += 1
        self._tidy_stash()
        if stage.rank < p - 1:
            tag = self._tag_of(0, index, stage.rank + 1)
            sends.append(send_async(y.detach(), self.next(index), self.activations, tag))

    def _backward(self, index: int, sends: list[Pending]) -> None:
        stage = self.stage
        flight = self.in_flight.pop(index)
        grad = None
        if stage.rank < stage.stages - 1:
            grad = recv(
                torch.empty_like(flight.y),
                self.next(index),
                self.gradients,
                self._tag_of(1, index, stage.rank),
            )
            ratio = self.per_update(stage.rank + 1) / self.per_update(stage.rank)
            if ratio != 1:  # the next stage's backward was scaled for its own updates
                grad *= ratio
        with self.stash.use(flight.version):
            torch.autograd.backward(flight.y, grad)
        updates = (index // self.workers + 1) % self.every == 0
        self.optimizer.add_gradients(self.stash.take_gradients(flight.version), sync=updates)
        if stage.rank > 0:
            tag = self._tag_of(1, index, stage.rank - 1)
            sent = send_async(_grad_of(flight.x), self.prev(index), self.gradients, tag)
            if self.ctx.device.type == "cpu":  # gloo: a wait blocks until the peer receives,
                sends.append(sent)  # which may be in its next step
            else:  # NCCL: a wait orders the streams; the gradient is freed after the send
                sent.wait()
        if updates:
            self._update()
        else:
            self._tidy_stash()

    def actions(self, micro: int, *, train: bool) -> list[Action]:
        """Evaluation's forwards (the live weights): this replica's micro-batches, in order."""
        assert not train, "training steps run the stream (run), not a flushed step"
        return [Action("F", i) for i in range(self.replica, micro, self.workers)]

    def drain(self) -> None:
        """Run the backwards (and updates) still owed; the pipeline is empty afterwards and the
        next step starts the stream again (from the latest weights)."""
        if not self.steps:
            return
        sends: list[Pending] = []
        for action in pipedream_drain(
            self.stage.stages, self.micro, self.stage.rank, self.steps, self.replicas, self.replica
        ):
            self._backward(action.micro, sends)
        for work in [*self.carried, *sends]:
            work.wait()
        self.carried = []
        self.steps = self.forwards = self.updates = 0
        self.stash.drop_except(set())
