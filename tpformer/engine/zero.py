"""ZeRO stages 0-3 over the DP group, on flat padded buffers (one bucket per transformer layer
plus one for every other parameter).

stage 0  plain data parallelism: full gradients all-reduced bucket by bucket while backward
         still runs (as DDP), full optimizer state on every rank.
stage 1  + optimizer state (and fp32 master weights) partitioned; updated shards all-gathered.
stage 2  + gradients reduce-scattered: each rank keeps only its gradient shard.
stage 3  + parameters partitioned: a layer's parameters are all-gathered just before its forward
         and again before its backward (the next layer prefetched), and freed after use.

Gradients accumulate in fp32 flat buffers over micro-batches; only the last micro-batch
communicates. The optimizer (AdamW, fused where the device has it) steps on flat shards, on
the CPU when offload is on.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from tpformer.config.schema import OptimConfig
from tpformer.config.validate import validate_engine
from tpformer.engine.flat_buffer import BufferPool, FlatBucket, Segment
from tpformer.engine.grad_clip import global_grad_norm
from tpformer.engine.lamb import FlatLamb, Piece
from tpformer.engine.precision import LossScaler, compute_dtype
from tpformer.layers.block import TransformerLayer
from tpformer.parallel.comm import all_gather_async, all_reduce_async, reduce_scatter_async, wait
from tpformer.parallel.context import ParallelContext


@dataclass
class BucketState:
    """What the engine holds for one bucket besides the layout."""

    master: Tensor
    """fp32 optimizer copy: the whole bucket at stage 0, this rank's shard at stages 1-3."""
    opt_params: list[tuple[nn.Parameter, int, int, bool]]
    """Views of the master the optimizer steps: (view, start, stop, decayed)."""
    master_aliased: bool
    """The master is the compute storage itself (fp32, no offload): no copy back after a step."""
    full: Tensor | None = None
    """Whole compute-dtype parameters (always at stages 0-2; only while in use at stage 3)."""
    param_shard: Tensor | None = None
    """Stage 3: this rank's parameter partition (on the CPU with params offload)."""
    grad: Tensor | None = None
    """Whole fp32 gradient accumulator (persistent at stages 0-1, transient at 2-3)."""
    grad_shard: Tensor | None = None
    """Stages 2-3: this rank's reduced fp32 gradient shard."""
    work: object = None
    launched: bool = False
    ready: int = 0
    pending: tuple | None = None


def _in_backward() -> bool:
    return torch._C._current_graph_task_id() != -1


def split_units(model: nn.Module) -> list[tuple[nn.Module | None, list[tuple[str, nn.Parameter]]]]:
    """One unit per TransformerLayer, then one (module None) for every other parameter."""
    layers = [(name, m) for name, m in model.named_modules() if isinstance(m, TransformerLayer)]
    in_layer: set[int] = set()
    units: list[tuple[nn.Module | None, list[tuple[str, nn.Parameter]]]] = []
    for name, layer in layers:
        params = [(f"{name}.{n}", p) for n, p in layer.named_parameters()]
        in_layer.update(id(p) for _, p in params)
        units.append((layer, params))
    rest = [(n, p) for n, p in model.named_parameters() if id(p) not in in_layer]
    units.append((None, rest))
    return units


class ZeroEngine:
    """Owns the model's parameter storage, gradient buffers and optimizer.

    Use: `engine.backward(loss, sync=last_micro_batch)` per micro-batch, then `engine.step()`.
    NOTE: the model's parameters become views of the engine's flat buffers (stage 3: empty
    between uses); do not build another optimizer over them.
    """

    def __init__(self, model: nn.Module, optim: OptimConfig, ctx: ParallelContext, *,
                 zero_stage: int, cpu_offload: str = "none", precision: str = "fp32") -> None:
        validate_engine(optim, zero_stage, cpu_offload)
        self.model, self.optim, self.ctx, self.stage = model, optim, ctx, zero_stage
        self.dtype = compute_dtype(precision, ctx.device)
        self.device = ctx.device
        self.state_device = torch.device("cpu") if cpu_offload != "none" else ctx.device
        self.param_device = torch.device("cpu") if cpu_offload == "optimizer+params" else ctx.device
        self.scaler = LossScaler(enabled=precision == "fp16", initial=optim.initial_loss_scale,
                                 window=optim.loss_scale_window)
        self.lr = optim.lr
        self.nonfinite_steps = 0
        self.sync = True
        self._callback_queued = False
        self.pool = BufferPool()
        self.buckets = [FlatBucket(params, ctx.dp.size, ctx.dp.rank, module=module)
                        for module, params in split_units(model) if params]
        self.states = [self._materialize(bucket) for bucket in self.buckets]
        fused = self.state_device.type in ("cpu", "cuda")
        groups = [{"params": [p for st in self.states for p, _, _, d in st.opt_params if d == decay],
                   "weight_decay": optim.weight_decay if decay else 0.0} for decay in (True, False)]
        groups = [g for g in groups if g["params"]]
        if optim.name == "lamb":
            pieces, num_segments = self._lamb_pieces()
            self.optimizer: torch.optim.Optimizer = FlatLamb(
                groups, pieces=pieces, num_segments=num_segments, tp=ctx.tp,
                dp=ctx.dp if self.stage >= 1 else None, comm_device=ctx.device, lr=optim.lr,
                betas=(optim.beta1, optim.beta2), eps=optim.eps)
        else:
            self.optimizer = torch.optim.AdamW(groups, lr=optim.lr, betas=(optim.beta1, optim.beta2),
                                               eps=optim.eps, fused=fused)
        for bucket, state in zip(self.buckets, self.states):
            for seg in bucket.segments:
                seg.param.register_post_accumulate_grad_hook(self._grad_hook(bucket, state, seg))
        if self.stage == 3:
            self._install_stage3_hooks()
        elif self.stage in (1, 2):
            self._install_param_wait_hooks()

    # ------------------------------------------------------------------ storage

    def _materialize(self, bucket: FlatBucket) -> BucketState:
        """Move the bucket's parameters into flat storage and create its fp32 master."""
        full = torch.zeros(bucket.padded_numel, dtype=self.dtype, device=self.device)
        with torch.no_grad():
            for seg in bucket.segments:
                bucket.view(full, seg).copy_(seg.param.detach())
        aliased = self.dtype == torch.float32 and self.state_device == self.device
        if self.stage == 3:
            aliased = aliased and self.param_device == self.device
            shard = bucket.shard_of(full).clone().to(self.param_device)
            master = shard if aliased else shard.float().to(self.state_device, copy=True)
            state = BucketState(master, self._opt_views(bucket, master), aliased,
                                param_shard=shard)
            self._free(bucket, state)
        else:
            source = full if self.stage == 0 else bucket.shard_of(full)
            master = source if aliased else source.float().to(self.state_device, copy=True)
            state = BucketState(master, self._opt_views(bucket, master), aliased, full=full)
            for seg in bucket.segments:
                seg.param.data = bucket.view(full, seg)
        if self.stage >= 2:
            state.grad_shard = torch.zeros(bucket.shard_size, dtype=torch.float32,
                                           device=self.device)
        return state

    def _lamb_pieces(self) -> tuple[dict[Tensor, list[Piece]], int]:
        """Where each logical parameter lies inside this rank's optimizer views, by segment id
        (ids are the same on every rank, so per-parameter norms can be all-reduced)."""
        pieces: dict[Tensor, list[Piece]] = {}
        first = 0
        for bucket, state in zip(self.buckets, self.states):
            ranges = ([(seg, seg.offset, seg.offset + seg.numel) for seg in bucket.segments]
                      if self.stage == 0 else bucket.shard_ranges())
            ids = {id(seg): first + i for i, seg in enumerate(bucket.segments)}
            for view, lo, hi, _ in state.opt_params:
                pieces[view] = [(ids[id(seg)], max(a, lo) - lo, min(b, hi) - lo, seg.tp_sharded)
                                for seg, a, b in ranges if max(a, lo) < min(b, hi)]
            first += len(bucket.segments)
        return pieces, first

    def _opt_views(self, bucket: FlatBucket, master: Tensor) -> list[tuple[nn.Parameter, int, int, bool]]:
        split = bucket.decay_split(whole=self.stage == 0)
        return [(nn.Parameter(master[a:b], requires_grad=False), a, b, decay)
                for (a, b), decay in zip(split, (True, False)) if b > a]

    def _free(self, bucket: FlatBucket, state: BucketState) -> None:
        """Stage 3: drop the whole parameters (the buffer goes back to the pool)."""
        empty = torch.empty(0, dtype=self.dtype, device=self.device)
        for seg in bucket.segments:
            seg.param.data = empty
        self.pool.give(state.full)
        state.full = None

    def _prefetch(self, state: BucketState) -> None:
        """Start the all-gather of a stage-3 bucket's parameters (no wait)."""
        if state.full is not None or state.pending is not None:
            return
        full = self.pool.take(state.param_shard.numel() * self.ctx.dp.size, self.dtype,
                              self.device, zero=False)
        shard = state.param_shard.to(self.device, non_blocking=True)
        state.pending = (all_gather_async(full, shard, self.ctx.dp), full, shard)

    def _gather(self, bucket: FlatBucket, state: BucketState) -> None:
        """Make a stage-3 bucket's parameters whole (waiting for a prefetch if one runs)."""
        if state.full is not None:
            return
        self._prefetch(state)
        work, full, _ = state.pending
        wait(work)
        state.pending, state.full = None, full
        for seg in bucket.segments:
            seg.param.data = bucket.view(full, seg)

    def _install_param_wait_hooks(self) -> None:
        """Stages 1-2: the post-step all-gather of a bucket overlaps the forward before it;
        each unit waits for its own parameters just before its forward."""
        for bucket, state in zip(self.buckets, self.states):
            module = bucket.module if bucket.module is not None else self.model
            module.register_forward_pre_hook(lambda m, args, state=state: self._wait_params(state))

    def _wait_params(self, state: BucketState) -> None:
        if self.stage in (1, 2) and state.pending is not None:
            wait(state.pending[0])
            state.pending = None

    def _install_stage3_hooks(self) -> None:
        units = list(zip(self.buckets, self.states))
        layers = [(b, s) for b, s in units if b.module is not None]
        root = next((b, s) for b, s in units if b.module is None)
        self.model.register_forward_pre_hook(lambda module, args: self._gather(*root))
        for i, (bucket, state) in enumerate(layers):
            after = layers[i + 1][1] if i + 1 < len(layers) else None
            before = layers[i - 1][1] if i > 0 else None
            bucket.module.register_forward_pre_hook(self._pre_forward(bucket, state, after))
            bucket.module.register_forward_hook(self._post_forward(bucket, state, before))

    def _pre_forward(self, bucket: FlatBucket, state: BucketState,
                     after: BucketState | None) -> Callable:
        def hook(module: nn.Module, args: object) -> None:
            self._gather(bucket, state)
            if after is not None and not _in_backward():
                self._prefetch(after)
        return hook

    def _post_forward(self, bucket: FlatBucket, state: BucketState,
                      before: BucketState | None) -> Callable:
        def regather(grad: Tensor) -> None:
            self._gather(bucket, state)
            if before is not None:
                self._prefetch(before)

        def hook(module: nn.Module, args: object, output: Tensor) -> None:
            if _in_backward():  # recomputation inside backward: parameters are still needed
                return
            self._free(bucket, state)
            if isinstance(output, Tensor) and output.requires_grad:
                output.register_hook(regather)
        return hook

    # ------------------------------------------------------------------ backward

    def backward(self, loss: Tensor, *, sync: bool = True) -> None:
        """Backward of one micro-batch; `sync=False` accumulates without any communication."""
        self.sync = sync
        (loss * self.scaler.scale if self.scaler.enabled else loss).backward()

    def _grad_hook(self, bucket: FlatBucket, state: BucketState,
                   seg: Segment) -> Callable[[Tensor], None]:
        def hook(param: Tensor) -> None:
            if not self._callback_queued:
                self._callback_queued = True
                torch.autograd.Variable._execution_engine.queue_callback(self._end_of_backward)
            if state.grad is None:
                state.grad = self.pool.take(bucket.padded_numel, torch.float32, self.device,
                                            zero=True)
            bucket.view(state.grad, seg).add_(param.grad)
            param.grad = None
            state.ready += 1
            if state.ready == len(bucket.segments):
                self._bucket_done(bucket, state)
        return hook

    def _bucket_done(self, bucket: FlatBucket, state: BucketState) -> None:
        """All of a bucket's gradients are in: launch its reduction (last micro-batch only)."""
        if self.sync and not state.launched and state.grad is not None:
            state.launched = True
            if self.stage >= 2:
                work = reduce_scatter_async(state.grad_shard, state.grad, self.ctx.dp)
                self._retire_reductions()
                state.work = work
            elif self.stage == 1:  # only this rank's part is stepped: reduce it in place
                state.work = reduce_scatter_async(bucket.shard_of(state.grad), state.grad,
                                                  self.ctx.dp)
            else:
                state.work = all_reduce_async(state.grad, self.ctx.dp)
        if self.stage == 3 and bucket.module is not None:
            self._free(bucket, state)

    def _retire_reductions(self) -> None:
        """Stages 2-3: wait for the reduce-scatters launched before the one just started and
        return their full gradient buffers, so the next bucket reuses them: besides the root's
        (filled from the heads to the embeddings), at most two layers' whole gradients coexist,
        the one in flight and the one filling. The previous bucket's reduction had a whole unit's
        backward to finish, so the wait is normally free; it is a wait, not a poll, because
        gloo's point-to-point work reports completion only once waited for."""
        for state in self.states:
            if state.grad is not None and state.work is not None:
                wait(state.work)
                state.work = None
                self.pool.give(state.grad)
                state.grad = None

    def _end_of_backward(self) -> None:
        """Launch what no hook launched (parameters without a gradient this time), in order."""
        self._callback_queued = False
        for bucket, state in zip(self.buckets, self.states):
            if state.ready != len(bucket.segments):
                self._bucket_done(bucket, state)
            state.ready = 0
            if self.stage == 3:
                self._free(bucket, state)

    # ------------------------------------------------------------------ step

    def _reduced_grads(self) -> list[Tensor]:
        """Wait for the reductions; each bucket's averaged fp32 gradient, shaped like its master."""
        scale = 1.0 / (self.ctx.dp.size * self.scaler.scale)
        grads = []
        for bucket, state in zip(self.buckets, self.states):
            if not state.launched:  # last backward had sync=False, or no gradient reached it
                if state.grad is None:
                    state.grad = torch.zeros(bucket.padded_numel, dtype=torch.float32,
                                             device=self.device)
                self.sync = True
                self._bucket_done(bucket, state)
            wait(state.work)
            state.work, state.launched = None, False
            if self.stage >= 2:
                grad = state.grad_shard
                self.pool.give(state.grad)  # the transient full buffer goes once reduced
                state.grad = None
            else:
                grad = state.grad if self.stage == 0 else bucket.shard_of(state.grad)
            grads.append(grad.mul_(scale))
        return grads

    @torch.no_grad()
    def step(self) -> dict[str, float]:
        """Reduce, unscale, clip, update and redistribute. Returns grad_norm and skipped."""
        self.settle()  # a step without a forward in between
        grads = self._reduced_grads()
        shard_grads = grads if self.stage >= 1 else [b.shard_of(g) for b, g in zip(self.buckets, grads)]
        norm = global_grad_norm(self.buckets, shard_grads, self.ctx.tp, self.ctx.dp)
        finite = math.isfinite(norm)
        self.scaler.update(not finite)
        if not finite:
            self._zero_grads()
            self.nonfinite_steps += 1
            if not self.scaler.enabled and self.nonfinite_steps > self.optim.max_nonfinite_steps:
                raise FloatingPointError(
                    f"non-finite gradients for {self.nonfinite_steps} consecutive steps "
                    f"(optim.max_nonfinite_steps={self.optim.max_nonfinite_steps}); the loss "
                    "diverged: lower optim.lr or check the data")
            return {"grad_norm": norm, "skipped": 1.0}
        self.nonfinite_steps = 0
        clip = self.optim.clip_grad
        coef = clip / (norm + 1e-6) if clip > 0 and norm > clip else 1.0
        for state, grad in zip(self.states, grads):
            if coef != 1.0:
                grad.mul_(coef)
            grad = grad.to(self.state_device, non_blocking=True)
            for param, a, b, _ in state.opt_params:
                param.grad = grad[a:b]
        for group in self.optimizer.param_groups:
            group["lr"] = self.lr
        self.optimizer.step()
        self._redistribute()
        self._zero_grads()
        return {"grad_norm": norm, "skipped": 0.0}

    def _redistribute(self) -> None:
        """Write the updated masters back to the compute parameters."""
        for state in self.states:
            for param, _, _, _ in state.opt_params:
                param.grad = None
            if state.master_aliased:
                continue
            if self.stage == 3:
                state.param_shard.copy_(state.master)
            elif self.stage == 0:
                state.full.copy_(state.master)
        if self.stage in (1, 2):  # waited for in the next forward (or by gathered())
            root_first = sorted(zip(self.buckets, self.states), key=lambda bs: bs[0].module is not None)
            for _, state in root_first:
                shard = state.master.to(self.device, self.dtype, copy=True)
                state.pending = (all_gather_async(state.full, shard, self.ctx.dp), None, shard)

    def _zero_grads(self) -> None:
        for state in self.states:
            if self.stage >= 2:
                state.grad_shard.zero_()
                self.pool.give(state.grad)
                state.grad = None
            elif state.grad is not None:
                state.grad.zero_()

    def set_lr(self, lr: float) -> None:
        """The learning rate of the next step (the schedule lives in the training loop)."""
        self.lr = lr

    def settle(self) -> None:
        """Finish the post-step all-gathers (stages 1-2) so the parameters can be read."""
        for state in self.states:
            self._wait_params(state)

    @contextmanager
    def gathered(self) -> Iterator[None]:
        """Every parameter whole and current inside the block (export, checkpoints, tests)."""
        self.settle()
        if self.stage == 3:
            for bucket, state in zip(self.buckets, self.states):
                self._gather(bucket, state)
        try:
            yield
        finally:
            if self.stage == 3:
                for bucket, state in zip(self.buckets, self.states):
                    self._free(bucket, state)
