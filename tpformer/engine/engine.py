"""ZeroEngine: data parallelism and ZeRO stages 0-3 over the DP group, on flat padded buffers (one
bucket per block the model names, plus one for every other parameter; with bucket_mb, pieces of
at most that many MiB of fp32 gradient).

stage 0  plain data parallelism: whole gradients all-reduced bucket by bucket while backward
         still runs (as DDP), the whole optimizer state on every rank.
stage 1  + optimizer state (and fp32 master weights) partitioned; updated shards all-gathered.
stage 2  + gradients reduce-scattered in every micro-batch: each rank keeps only its gradient
         shard, which accumulates the micro-batches.
stage 3  + parameters partitioned: gathered for each block's forward and backward, then freed.

Under sequence parallelism the gradients of LayerNorms and other parameters of the
sequence-sharded regions are partial per TP rank; the step sums them over TP once. The DP
reduction may be compressed (bf16 or PowerSGD, compression.py).

The stage picks three strategies once, here: where parameters live (params.py), how gradients
are reduced (grads.py) and which part of each bucket the optimizer owns (optimizer.py). The
engine only wires autograd hooks to them and runs the step; it knows no layer or model class.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
from torch import Tensor, nn

from tpformer.config.schema import OptimConfig
from tpformer.engine.flat_buffer import BufferPool, FlatBucket, Segment
from tpformer.engine.grad_clip import global_grad_norm
from tpformer.engine.grads import (
    PipelineTiedGrads,
    SequenceParallelGrads,
    build_grads,
    use_sparse_lookups,
)
from tpformer.engine.memory import MemoryBytes, optimizer_state_bytes
from tpformer.engine.optimizer import build_masters, build_optimizer
from tpformer.engine.params import PartitionedParams, ReplicatedParams, host_device
from tpformer.engine.precision import LossScaler, compute_dtype, use_fp8_linears
from tpformer.engine.state import load_logical_state, logical_state
from tpformer.engine.units import bucket_elements, split_units
from tpformer.parallel.context import ParallelContext


class ZeroEngine:
    """Owns the model's parameter storage, gradient buffers, optimizer and their state.

    Use: `engine.backward(loss, sync=last_micro_batch)` per micro-batch, then `engine.step()`.
    Gradients are summed over micro-batches and DP ranks, never averaged: each rank's `loss`
    is its share of the global objective (e.g. a mean over this rank's samples divided by dp,
    or a sum divided by the global count), so the normalization lives in the loss alone.
    `state_dict()` / `load_state_dict()` follow DCP's Stateful protocol in logical form, so a
    checkpoint written at one layout loads at any other.
    NOTE: the model's parameters become views of the engine's flat buffers (stage 3: empty
    between uses); do not build another optimizer over them.
    """

    def __init__(
        self,
        model: nn.Module,
        optim: OptimConfig,
        ctx: ParallelContext,
        *,
        zero_stage: int,
        cpu_offload: str = "none",
        precision: str = "fp32",
        grad_compression: str = "none",
        powersgd_rank: int = 1,
        powersgd_start_step: int = 0,
        independent_stages: bool = False,
        bucket_mb: float = 0.0,
    ) -> None:
        self.model, self.ctx, self.stage = model, ctx, zero_stage
        self.norm_group_pp = None if independent_stages else ctx.pp
        """Clipping's norm spans the pipeline, except where each stage updates on its own
        (pipedream: a pipeline-wide norm would make the stages wait for each other)."""
        self.clip_grad = optim.clip_grad
        self.dtype = compute_dtype(precision)
        self.scaler = LossScaler(
            enabled=precision == "fp16",
            initial=optim.initial_loss_scale,
            window=optim.loss_scale_window,
            device=ctx.device,
        )
        self.lr = optim.lr
        self._nonfinite_run = torch.zeros((), dtype=torch.long, device=ctx.device)
        self._longest_nonfinite = torch.zeros((), dtype=torch.long, device=ctx.device)
        self.max_nonfinite_steps = optim.max_nonfinite_steps
        self.sync = True
        self._callback_queued = False
        self.pool = BufferPool()
        self.buckets = [
            FlatBucket(u.params, ctx.replicas.size, ctx.replicas.rank, module=u.module)
            for u in split_units(model, max_elements=bucket_elements(bucket_mb))
        ]
        self.whole_master = zero_stage == 0
        self.params = self._place_parameters(cpu_offload)
        self.grads = build_grads(
            self.buckets,
            ctx,
            self.pool,
            stage=zero_stage,
            compression=grad_compression,
            powersgd_rank=powersgd_rank,
            powersgd_start_step=powersgd_start_step,
        )
        self.sequence_grads = SequenceParallelGrads(self.buckets, ctx.tp, whole=self.whole_master)
        self.tied_grads = PipelineTiedGrads(self.buckets, ctx.pipeline_ends)
        state_device = host_device(ctx.device) if cpu_offload != "none" else ctx.device
        self._build_optimizer(optim, state_device)
        self._ready = [0] * len(self.buckets)
        if ctx.device.type == "cpu":  # see RowSparseLookup
            use_sparse_lookups(model)
        if precision == "fp8":
            use_fp8_linears(model, ctx)
        self._segments: dict[int, tuple[int, Segment]] = {}
        self._hook_gradients()

    def _place_parameters(self, cpu_offload: str) -> ReplicatedParams | PartitionedParams:
        """Where the parameters live between uses: partitioned over DP at stage 3 (gathered per
        block, optionally offloaded), replicated otherwise."""
        ctx = self.ctx
        if self.stage == 3:
            return PartitionedParams(
                self.model,
                self.buckets,
                ctx.replicas,
                dtype=self.dtype,
                device=ctx.device,
                offload=cpu_offload == "optimizer+params",
            )
        return ReplicatedParams(
            self.model,
            self.buckets,
            ctx.replicas,
            dtype=self.dtype,
            device=ctx.device,
            sharded_master=self.stage >= 1,
        )

    def _build_optimizer(self, optim: OptimConfig, state_device: torch.device) -> None:
        """The fp32 masters (aliasing the parameters when they are fp32 on the same device)
        and the optimizer over their views."""
        self.master_aliased = (
            self.dtype == torch.float32
            and state_device == self.ctx.device
            and self.params.aliasable
        )
        owned = [self.params.owned(i) for i in range(len(self.buckets))]
        self.masters = build_masters(
            self.buckets,
            owned,
            whole=self.whole_master,
            aliased=self.master_aliased,
            device=state_device,
        )
        self.optimizer = build_optimizer(
            optim,
            self.buckets,
            self.masters,
            whole=self.whole_master,
            tp=self.ctx.tp,
            dp=self.ctx.replicas,
            comm_device=self.ctx.device,
        )

    def _hook_gradients(self) -> None:
        """Each parameter's accumulated gradient goes into its bucket as backward produces it."""
        for i, bucket in enumerate(self.buckets):
            for seg in bucket.segments:
                seg.param.register_post_accumulate_grad_hook(self._grad_hook(i, seg))
                self._segments[id(seg.param)] = (i, seg)

    # ------------------------------------------------------------------ backward

    def backward(self, loss: Tensor, *, sync: bool = True, grad: Tensor | None = None) -> None:
        """Backward of one micro-batch; `sync=False` accumulates without communicating (stages 0-1;
        stages 2-3 reduce-scatter every micro-batch into the shard).
        The gradient summed over every micro-batch and DP rank is the step's gradient. With
        `grad`, `loss` is a pipeline stage's output and `grad` its (already scaled) gradient
        from the next stage."""
        self.sync = sync
        if grad is not None:
            torch.autograd.backward(loss, grad)
            return
        (loss * self.scaler.scale if self.scaler.enabled else loss).backward()

    def add_gradients(self, grads: list[tuple[nn.Parameter, Tensor]], *, sync: bool) -> None:
        """Gradients autograd left on other tensors than the parameters (PipeDream's stashed
        weight copies), added as the parameters' hooks add theirs; `sync` as for backward."""
        self.sync = sync
        for param, grad in grads:
            i, seg = self._segments[id(param)]
            self.grads.accumulate(i, seg, grad)
        self._end_of_backward()

    def _grad_hook(self, i: int, seg: Segment) -> Callable[[Tensor], None]:
        def hook(param: Tensor) -> None:
            if not self._callback_queued:
                self._callback_queued = True
                torch.autograd.Variable._execution_engine.queue_callback(self._end_of_backward)
            grad = param.grad
            assert grad is not None  # a post-accumulate-grad hook runs after one was written
            self.grads.accumulate(i, seg, grad)
            param.grad = None
            self._ready[i] += 1
            if self._ready[i] == len(self.buckets[i].segments):
                self._bucket_done(i)

        return hook

    def _bucket_done(self, i: int) -> None:
        """All of a bucket's gradients are in: launch its reduction (stages 0-1: in the last
        micro-batch only; 2-3: in every one)."""
        if self.sync or self.grads.every_micro_batch:
            self.grads.launch(i)
        self.params.after_backward(i)

    def _end_of_backward(self) -> None:
        """Launch what no hook launched (parameters without a gradient this time), in order."""
        self._callback_queued = False
        for i, bucket in enumerate(self.buckets):
            if self._ready[i] != len(bucket.segments):
                self._bucket_done(i)
            self._ready[i] = 0
        self.params.free_all()

    # ------------------------------------------------------------------ step

    @torch.no_grad()
    def step(self) -> dict[str, float]:
        """`queue_step`, then read: grad_norm and skipped as numbers (tests, tools)."""
        status = self.queue_step()
        self.check_finite()
        return {k: float(v) for k, v in status.items()}

    @torch.no_grad()
    def queue_step(self) -> dict[str, Tensor]:
        """Reduce, unscale, clip, update and redistribute; returns grad_norm and skipped as
        device scalars. A step with a non-finite gradient leaves the weights and optimizer
        state unchanged, decided on the device (the optimizer's found_inf, the loss scaler's
        device update): nothing here waits for the device (with the optimizer offloaded to
        the CPU, its step waits for the gradients' copy as it must). `check_finite` raises after
        optim.max_nonfinite_steps consecutive skipped steps."""
        self.settle()  # a step without a forward in between
        scale = 1.0 / self.scaler.scale if self.scaler.enabled else 1.0  # folded into clipping
        grads = [self.grads.reduced(i) for i in range(len(self.buckets))]
        self.sequence_grads.sum_over_tp(grads)
        self.tied_grads.sum_over_ends(grads)
        shard_grads = (
            [b.shard_of(g) for b, g in zip(self.buckets, grads)] if self.whole_master else grads
        )  # each DP rank counts only its chunk in the norm
        norm = scale * global_grad_norm(
            self.buckets, shard_grads, self.ctx.tp, self.ctx.replicas, self.norm_group_pp
        )
        finite = torch.isfinite(norm)
        self.scaler.update(~finite)
        clip = self.clip_grad
        coef = scale * torch.where(norm > clip, clip / (norm + 1e-6), 1.0) if clip > 0 else scale
        if not isinstance(coef, float) or coef != 1.0:
            torch._foreach_mul_(grads, coef)
        for master, grad in zip(self.masters, grads):
            grad = grad.to(master.values.device, non_blocking=True)
            for view in master.views:
                view.param.grad = grad[view.start : view.stop]
        for group in self.optimizer.param_groups:
            group["lr"] = self.lr
        # every optimizer the engine builds skips its whole update when found_inf is 1
        state_device = self.masters[0].values.device
        self.optimizer.found_inf = (~finite).float().to(state_device)  # type: ignore[attr-defined]
        self.optimizer.step()
        for master in self.masters:
            for view in master.views:
                view.param.grad = None
        self.params.publish([m.values for m in self.masters], self.master_aliased)
        self.grads.zero()
        self._count_finite(finite)
        return {"grad_norm": norm, "skipped": (~finite).double()}

    def _count_finite(self, finite: Tensor) -> None:
        """The run of consecutive non-finite steps and its longest since the last check, on
        the device."""
        self._nonfinite_run = torch.where(finite, 0, self._nonfinite_run + 1)
        self._longest_nonfinite = torch.maximum(self._longest_nonfinite, self._nonfinite_run)

    def check_finite(self) -> None:
        """Raise when some run of non-finite steps since the last check reached
        optim.max_nonfinite_steps (one device read: call it where the host reads anyway)."""
        longest = int(self._longest_nonfinite)
        self._longest_nonfinite = self._nonfinite_run.clone()
        if longest >= self.max_nonfinite_steps:
            now = f", loss scale now {float(self.scaler.scale):g}" if self.scaler.enabled else ""
            raise FloatingPointError(
                f"non-finite gradients for {longest} consecutive steps "
                f"(optim.max_nonfinite_steps={self.max_nonfinite_steps}{now}); the loss "
                "diverged: lower optim.lr or check the data"
            )

    def set_lr(self, lr: float) -> None:
        """The learning rate of the next step (the schedule lives in the training loop)."""
        self.lr = lr

    def settle(self) -> None:
        """Finish the post-step all-gathers (stages 1-2) so the parameters can be read."""
        self.params.settle()

    @contextmanager
    def gathered(self) -> Iterator[None]:
        """Every parameter whole and current inside the block (evaluation, export, tests)."""
        self.settle()
        self.params.gather_all()
        try:
            yield
        finally:
            self.params.free_all()

    # ------------------------------------------------------------------ state

    def state_dict(self, *, saving: bool = False) -> dict[str, Tensor]:
        """Logical, layout-free state: fp32 parameters and optimizer moments by parameter name
        (DTensors for TP-sharded ones), the optimizer step, the loss scaler and the count of
        consecutive non-finite steps. Every rank of the job must call it (it gathers over DP).
        `saving`: what this rank writes (DCP's loading template asks for every name it holds)."""
        self.settle()
        state = logical_state(
            self.buckets,
            self.masters,
            self.optimizer,
            self.ctx,
            whole=self.whole_master,
            saving=saving,
        )
        state.update(
            {
                "loss_scale": self.scaler.scale.double().cpu(),
                "clean_steps": self.scaler.clean_steps.cpu(),
                "nonfinite_steps": self._nonfinite_run.cpu(),
            }
        )
        return state

    def weights_state_dict(self) -> dict[str, Tensor]:
        """ "param/<name>" of `state_dict()` only: what export and a model without an engine
        load (a third of the bytes of the full state under AdamW). Every rank must call it."""
        self.settle()
        return logical_state(
            self.buckets,
            self.masters,
            self.optimizer,
            self.ctx,
            whole=self.whole_master,
            weights_only=True,
            saving=True,
        )

    def load_state_dict(self, state: dict[str, Tensor]) -> None:
        """Load `state_dict()`'s form, saved at any layout (DCP reshards into this one's)."""
        self.settle()
        params = load_logical_state(
            self.buckets, self.masters, self.optimizer, self.ctx, state, whole=self.whole_master
        )
        for i, values in enumerate(params):
            self.params.load_whole(i, values)
        self.scaler.load_state_dict(
            {"scale": float(state["loss_scale"]), "clean_steps": int(state["clean_steps"])}
        )
        self._nonfinite_run.fill_(int(state["nonfinite_steps"]))
        self._longest_nonfinite.fill_(int(state["nonfinite_steps"]))

    def memory_report(self) -> MemoryBytes:
        """Bytes this rank holds between steps in parameters, gradients and optimizer state,
        measured from the engine's own tensors (compare with memory.zero_memory_bytes)."""
        masters = 0 if self.master_aliased else sum(m.values.nbytes for m in self.masters)
        views = [view.param for master in self.masters for view in master.views]
        optimizer = masters + optimizer_state_bytes(self.optimizer, views)
        return MemoryBytes(self.params.nbytes(), self.grads.nbytes(), optimizer)

    def working_bytes(self) -> int:
        """Bytes of the working buffers held now beside the model state: ZeRO 2-3's whole
        gradient buckets (pooled, kept once made) and ZeRO-3's gathered parameters (what the
        planner calls buffers; train/dry_run.py samples it through a step)."""
        pooled = self.pool.made_bytes if self.stage >= 2 else 0  # else the gradients themselves
        return pooled + self.params.gathered_bytes()

    def __repr__(self) -> str:
        return (
            f"ZeroEngine(stage={self.stage}, buckets={len(self.buckets)}, "
            f"dtype={self.dtype}, dp={self.ctx.replicas.size})"
        )
