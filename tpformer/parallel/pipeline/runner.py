"""Runs one step's schedule on this stage over point-to-point messages.

Per action: a forward receives its input activation from the previous virtual stage (blocking,
up to the process group's timeout, so a dead stage ends the others), runs its blocks with the
dropout keyed by the micro-batch's global position, and sends the output on without waiting; a
backward receives the output's gradient, runs autograd through the chunk and sends the input's
gradient back. The last virtual stage turns its output into the objective's values and
backpropagates the loss. Every message carries a tag naming (kind, micro-batch, receiving
virtual stage), so gloo matches them whatever the order; activations and gradients travel on two
communicators, so NCCL's in-order matching sees one stream of each.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import Tensor

from tpformer.parallel.comm import Pending, process_group, recv, send_async
from tpformer.parallel.context import ParallelContext
from tpformer.parallel.handle import GroupHandle
from tpformer.parallel.pipeline.schedule import Action, actions_for, virtual_stage
from tpformer.parallel.pipeline.stage import PipelineStage
from tpformer.parallel.regions import region

Batch = dict[str, Tensor]
Values = Callable[[object, Batch], list[Tensor]]
"""(the model's output on the last stage, the micro-batch) -> the objective's values."""
Backward = Callable[[Tensor, Tensor | None, bool], None]
"""(tensor, its gradient or None for the loss, last backward of the step) -> None."""


def _grad_of(x: Tensor | None) -> Tensor:
    """The gradient backward left on a stage's received input (sent back to the previous one)."""
    assert x is not None and x.grad is not None, "the stage input got no gradient"
    return x.grad


def release_output(y: Tensor) -> None:
    """Free a sent stage output's storage while keeping it as the root of its backward (what
    Megatron-LM's deallocate_output_tensor does): its backward needs only its shape and graph,
    so its data becomes one element seen at every position (zero strides: the shape stays, so
    torch.autograd.backward takes the received gradient). A view or a leaf (a stage that
    passes its input through) keeps its data; an operator that saved the output keeps its own
    reference to the storage, so backward is unchanged either way."""
    if y._base is not None or y.grad_fn is None:
        return
    y.data = torch.empty_strided(y.shape, (0,) * y.dim(), dtype=y.dtype, device=y.device)


def _duplicate_groups(ctx: ParallelContext) -> GroupHandle:
    """A second communicator over each pipeline (every rank creates all, in the same order)."""
    mine = GroupHandle.single()
    for ranks in ctx.layout.pp_groups():
        group = dist.new_group(ranks)
        if ctx.rank in ranks:
            mine = GroupHandle(group, ranks.index(ctx.rank), len(ranks), monitor=ctx.monitor)
            ctx.monitor.recorder.name_group(group, "pp_gradients")
    return mine


@dataclass
class _StepState:
    """What one step's actions share: its micro-batches, the objective totals, the kept inputs
    and outputs awaiting their backward, and the sends in flight."""

    step: int
    parts: list[tuple[int, Batch]]
    totals: Tensor
    inputs: dict[tuple[int, int], Tensor | None] = field(default_factory=dict)
    outputs: dict[tuple[int, int], Tensor] = field(default_factory=dict)
    sent: dict[tuple[int, int], Pending] = field(default_factory=dict)
    """Output sends by slot on gloo, waited at the slot's backward: its gradient came back, so
    the output arrived long before, and the output's storage goes with its backward. On an
    accelerator the send is waited at once and the output freed (release_output)."""
    sends: list[Pending] = field(default_factory=list)
    """Gradient sends (and outputs in evaluation), waited at the end of the step."""


class PipelineRunner:
    """Executes `schedule` for this rank's `stage`; activations are [b, s / seq_split, hidden]."""

    def __init__(
        self,
        stage: PipelineStage,
        ctx: ParallelContext,
        *,
        schedule: str,
        hidden: int,
        dtype: torch.dtype,
    ) -> None:
        self.stage, self.ctx, self.schedule = stage, ctx, schedule
        self.hidden, self.dtype = hidden, dtype
        # this rank's part of the sequence: its CP chunks, and its TP chunk of them under SP
        self.seq_split = (ctx.tp.size if ctx.sequence_parallel else 1) * ctx.cp.size
        self.activations = ctx.pp
        self.gradients = _duplicate_groups(ctx)

    def prev(self, micro: int) -> int:
        """The rank (in ctx.pp) of the previous stage that runs `micro` (the last stage's for
        the first: interleaved chunks wrap around)."""
        p = self.stage.stages
        return self.ctx.layout.peer((self.stage.rank - 1) % p, micro)

    def next(self, micro: int) -> int:
        """The rank (in ctx.pp) of the next stage that runs `micro`."""
        p = self.stage.stages
        return self.ctx.layout.peer((self.stage.rank + 1) % p, micro)

    def _tag(self, kind: int, micro: int, vstage: int, micros: int) -> int:
        return (vstage * micros + micro) * 2 + kind

    def _shape(self, batch: Batch) -> tuple[int, int, int]:
        b, s = batch["input_ids"].shape
        return b, s // self.seq_split, self.hidden

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
        """Forward (and backward) every micro-batch of the step through this stage; returns the
        summed objective values on the last stage, zeros elsewhere."""
        actions = self.actions(len(parts), train=train)
        last_backward = max((i for i, a in enumerate(actions) if a.kind == "B"), default=-1)
        state = _StepState(
            step, parts, torch.zeros(n_values, dtype=torch.float64, device=self.ctx.device)
        )
        for index, action in enumerate(actions):
            with region(f"{action.kind} micro {action.micro} chunk {action.chunk}"):
                if action.kind == "F":
                    self._forward_action(action, state, values, train=train)
                else:
                    self._backward_action(action, state, backward, last=index == last_backward)
        for work in [*state.sent.values(), *state.sends]:
            work.wait()
        return state.totals

    def _forward_action(
        self, action: Action, state: _StepState, values: Values, *, train: bool
    ) -> None:
        """One micro-batch's forward through one chunk: receive its input (unless the first
        virtual stage), run the chunk (and on the last virtual stage the head and objective),
        send the output on; kept for the backward when training."""
        stage, ctx, m = self.stage, self.ctx, len(state.parts)
        key, batch = state.parts[action.micro]
        vs = virtual_stage(action.chunk, stage.rank, stage.stages)
        last_v = stage.stages * len(stage.chunks) - 1
        ctx.rng.set_position(state.step, key)
        x = None
        if vs > 0:
            x = recv(
                torch.empty(self._shape(batch), dtype=self.dtype, device=ctx.device),
                self.prev(action.micro),
                self.activations,
                self._tag(0, action.micro, vs, m),
            )
            x.requires_grad_(train)
        with torch.set_grad_enabled(train):
            y = stage.forward(action.chunk, x, batch)
            if vs == last_v:
                vals = values(stage.head(y, batch), batch)
                state.totals += torch.stack([t.detach().double() for t in vals])
                y = vals[0]
        if vs < last_v:
            sent = send_async(
                y.detach(),
                self.next(action.micro),
                self.activations,
                self._tag(0, action.micro, vs + 1, m),
            )
            if not train:
                state.sends.append(sent)
            elif ctx.device.type == "cpu":  # gloo: a wait blocks until the peer receives
                state.sent[(action.micro, action.chunk)] = sent
            else:  # NCCL: a wait orders the streams; the output is freed after its send
                sent.wait()
                release_output(y)
        if train:
            state.inputs[(action.micro, action.chunk)] = x
            state.outputs[(action.micro, action.chunk)] = y

    def _backward_action(
        self, action: Action, state: _StepState, backward: Backward, *, last: bool
    ) -> None:
        """One micro-batch's backward through one chunk: receive the output's gradient (unless
        the last virtual stage), run backward, send the input's gradient back."""
        stage, m = self.stage, len(state.parts)
        vs = virtual_stage(action.chunk, stage.rank, stage.stages)
        slot = (action.micro, action.chunk)
        x, y = state.inputs.pop(slot), state.outputs.pop(slot)
        grad = None
        if vs < stage.stages * len(stage.chunks) - 1:
            grad = recv(
                torch.empty(y.shape, dtype=y.dtype, device=y.device),
                self.next(action.micro),
                self.gradients,
                self._tag(1, action.micro, vs, m),
            )
            if (sent := state.sent.pop(slot, None)) is not None:
                sent.wait()
        backward(y, grad, last)
        if vs > 0:
            sent = send_async(
                _grad_of(x),
                self.prev(action.micro),
                self.gradients,
                self._tag(1, action.micro, vs - 1, m),
            )
            if self.ctx.device.type == "cpu":  # gloo: a wait blocks until the peer receives
                state.sends.append(sent)
            else:  # NCCL: a wait orders the streams; the gradient is freed after the send
                sent.wait()

    def actions(self, micro: int, *, train: bool) -> list[Action]:
        """This stage's actions for a step of `micro` micro-batches (forwards only if not
        `train`)."""
        stage = self.stage
        return actions_for(
            self.schedule, stage.stages, micro, stage.rank, len(stage.chunks), train=train
        )

    def outputs(self, batch: Batch, extract: Callable[[object], Tensor]) -> Tensor:
        """Forward one batch through the pipeline (no gradients) and return `extract` of the
        model's output, computed on the last stage, on every stage (prediction)."""
        out: list[Tensor] = []

        def keep(output: object, _: Batch) -> list[Tensor]:
            out.append(extract(output))
            return [torch.zeros(())]

        self.run(0, [(0, batch)], keep, 1, lambda *_: None, train=False)
        box = [out[0].cpu() if out else None]
        last = self.ctx.layout.peer(self.stage.stages - 1, 0)
        src = dist.get_global_rank(process_group(self.ctx.pp), last)
        dist.broadcast_object_list(box, src=src, group=self.ctx.pp.group)
        return box[0].to(self.ctx.device)  # type: ignore[union-attr]
