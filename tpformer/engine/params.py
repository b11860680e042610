"""Where the compute-dtype parameters live between uses: the model's parameters become views of
one flat buffer per bucket.

ReplicatedParams   stages 0-2: every rank keeps the whole bucket. After a step, stage 0 copies
                   its (whole) master in; stages 1-2 all-gather the updated shards, and each
                   unit waits for its own gather just before its forward, so the gathers overlap
                   the forward of the units before it.
PartitionedParams  stage 3: every rank keeps only its shard. A block's parameters are
                   all-gathered just before its forward and again before its backward (the next
                   block prefetched), and freed after use; the root unit stays gathered from
                   the model's forward to the end of backward.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from tpformer.engine.flat_buffer import FlatBucket
from tpformer.parallel.comm import Pending, all_gather_async, wait
from tpformer.parallel.handle import GroupHandle


@dataclass
class PendingGather:
    """An all-gather in flight; `shard` is its source, kept alive until it is done."""

    work: Pending | None
    shard: Tensor


def _in_backward() -> bool:
    return torch._C._current_graph_task_id() != -1


def host_device(device: torch.device) -> torch.device:
    """Where offloaded state lives: the host, or in a dry run (everything on the meta device,
    train/dry_run.py) the meta device, which stands for every memory."""
    return device if device.type == "meta" else torch.device("cpu")


class ReplicatedParams:
    """Stages 0-2 (see the module docstring). `sharded_master`: the optimizer owns only this
    rank's chunk of each bucket (stages 1-2), so updates are all-gathered."""

    def __init__(
        self,
        model: nn.Module,
        buckets: list[FlatBucket],
        dp: GroupHandle,
        *,
        dtype: torch.dtype,
        device: torch.device,
        sharded_master: bool,
    ) -> None:
        self.buckets, self.dp, self.dtype, self.device = buckets, dp, dtype, device
        self.sharded_master = sharded_master
        self.full: list[Tensor] = []
        self.pending: list[PendingGather | None] = [None] * len(buckets)
        for bucket in buckets:  # bucket by bucket: the original tensors go as each is moved
            self.full.append(bucket.flatten(dtype, device))
            for seg in bucket.segments:
                seg.param.data = bucket.view(self.full[-1], seg)
        if sharded_master:
            for i, bucket in enumerate(buckets):
                module = bucket.module if bucket.module is not None else model
                module.register_forward_pre_hook(lambda m, args, i=i: self._wait(i))

    def owned(self, i: int) -> Tensor:
        """The values of the part of bucket i the optimizer steps (whole, or this rank's chunk)."""
        return self.buckets[i].shard_of(self.full[i]) if self.sharded_master else self.full[i]

    @property
    def aliasable(self) -> bool:
        """The owned part can be the fp32 master itself (it lives on the compute device)."""
        return True

    def publish(self, masters: list[Tensor], aliased: bool) -> None:
        """Make the updated masters the compute parameters."""
        if not self.sharded_master:
            if not aliased:
                for full, master in zip(self.full, masters):
                    full.copy_(master)
            return
        # waited for in the next forward (or by settle()); the root first, as forward needs it
        order = sorted(range(len(self.buckets)), key=lambda i: self.buckets[i].module is not None)
        for i in order:
            shard = masters[i].to(self.device, self.dtype, copy=True)
            self.pending[i] = PendingGather(all_gather_async(self.full[i], shard, self.dp), shard)

    def _wait(self, i: int) -> None:
        pending = self.pending[i]
        if pending is not None:
            wait(pending.work)
            self.pending[i] = None

    def settle(self) -> None:
        """Finish the post-step all-gathers so the parameters can be read."""
        for i in range(len(self.buckets)):
            self._wait(i)

    def gather_all(self) -> None:
        self.settle()

    def free_all(self) -> None:
        """Nothing to free: the parameters are always whole."""

    def after_backward(self, i: int) -> None:
        """Bucket i's gradients are all in (nothing to do when parameters stay whole)."""

    def load_whole(self, i: int, whole: Tensor) -> None:
        """Set bucket i from its whole (fp32) flat values."""
        self.full[i].copy_(whole)

    def nbytes(self) -> int:
        return sum(f.numel() * f.element_size() for f in self.full)

    def gathered_bytes(self) -> int:
        """Stages 0-2 gather nothing beyond the parameters they hold."""
        return 0


class PartitionedParams:
    """Stage 3 (see the module docstring). With `offload` the shards live on the CPU, in pinned
    memory when the device is a GPU: the prefetch's host-to-device copy is then asynchronous
    (from pageable memory it would wait for the host; untested here, no GPU).

    Each bucket has one flat compute-dtype buffer whose storage is allocated for a gather and
    released (resized to zero bytes) after use, as FSDP does; the parameters are views of it
    for good. Autograd keeps views of parameters from forward to backward (a linear layer saves
    its weight transposed), and those find the re-gathered values in the same storage."""

    def __init__(
        self,
        model: nn.Module,
        buckets: list[FlatBucket],
        dp: GroupHandle,
        *,
        dtype: torch.dtype,
        device: torch.device,
        offload: bool,
    ) -> None:
        self.model, self.buckets, self.dp, self.device = model, buckets, dp, device
        self.shard_device = host_device(device) if offload else device
        self.flat: list[Tensor] = []
        self.gathered = [False] * len(buckets)
        self.pending: list[PendingGather | None] = [None] * len(buckets)
        self.shard: list[Tensor] = []
        pinned = offload and device.type == "cuda"  # so a prefetch's copy overlaps compute
        for bucket in buckets:
            flat = bucket.flatten(dtype, device)
            shard = bucket.shard_of(flat).clone().to(self.shard_device)
            self.shard.append(shard.pin_memory() if pinned else shard)
            for seg in bucket.segments:
                seg.param.data = bucket.view(flat, seg)
            flat.untyped_storage().resize_(0)
            self.flat.append(flat)
        self._install_hooks()

    def owned(self, i: int) -> Tensor:
        return self.shard[i]

    @property
    def aliasable(self) -> bool:
        return self.shard_device == self.device

    def publish(self, masters: list[Tensor], aliased: bool) -> None:
        if not aliased:
            for shard, master in zip(self.shard, masters):
                shard.copy_(master)

    def _free(self, i: int) -> None:
        """Release bucket i's whole parameters (a gather in flight keeps its storage)."""
        if self.gathered[i]:
            self.flat[i].untyped_storage().resize_(0)
            self.gathered[i] = False

    def _prefetch(self, i: int) -> None:
        """Start the all-gather of bucket i's parameters (no wait)."""
        if self.gathered[i] or self.pending[i] is not None:
            return
        flat = self.flat[i]
        flat.untyped_storage().resize_(flat.numel() * flat.element_size())
        shard = self.shard[i].to(self.device, non_blocking=True)
        self.pending[i] = PendingGather(all_gather_async(flat, shard, self.dp), shard)

    def _gather(self, i: int) -> None:
        """Make bucket i's parameters whole (waiting for a prefetch if one runs)."""
        if self.gathered[i]:
            return
        self._prefetch(i)
        pending = self.pending[i]
        assert pending is not None, f"bucket {i}: no gather was started"
        wait(pending.work)
        self.pending[i], self.gathered[i] = None, True

    def _install_hooks(self) -> None:
        blocks = [i for i, b in enumerate(self.buckets) if b.module is not None]
        roots = [i for i, b in enumerate(self.buckets) if b.module is None]
        if roots:
            self.model.register_forward_pre_hook(lambda module, args: self._gather_all(roots))
        for k, i in enumerate(blocks):
            after = blocks[k + 1] if k + 1 < len(blocks) else None
            before = blocks[k - 1] if k > 0 else None
            module = self.buckets[i].module
            assert module is not None  # blocks are the buckets with a module
            module.register_forward_pre_hook(self._pre_forward(i, after))
            module.register_forward_hook(self._post_forward(i, before))

    def _gather_all(self, indices: list[int]) -> None:
        """Start every gather, then wait for each (the buckets' all-gathers queue together)."""
        for i in indices:
            self._prefetch(i)
        for i in indices:
            self._gather(i)

    def _pre_forward(self, i: int, after: int | None) -> Callable:
        def hook(module: nn.Module, args: object) -> None:
            self._gather(i)
            if after is not None and not _in_backward():
                self._prefetch(after)

        return hook

    def _post_forward(self, i: int, before: int | None) -> Callable:
        def regather(grad: Tensor) -> None:
            self._gather(i)
            if before is not None:
                self._prefetch(before)

        def hook(module: nn.Module, args: object, output: Tensor) -> None:
            if _in_backward():  # recomputation inside backward: parameters are still needed
                return
            self._free(i)
            if isinstance(output, Tensor) and output.requires_grad:
                output.register_hook(regather)

        return hook

    def settle(self) -> None:
        """Nothing is gathered after a step (shards are updated in place)."""

    def gather_all(self) -> None:
        self._gather_all(list(range(len(self.buckets))))

    def free_all(self) -> None:
        for i in range(len(self.buckets)):
            self._free(i)

    def after_backward(self, i: int) -> None:
        """A block's gradients are all in: its parameters are not needed until the next forward."""
        if self.buckets[i].module is not None:
            self._free(i)

    def load_whole(self, i: int, whole: Tensor) -> None:
        self.shard[i].copy_(self.buckets[i].shard_of(whole))

    def nbytes(self) -> int:
        return sum(s.numel() * s.element_size() for s in self.shard)

    def gathered_bytes(self) -> int:
        """Bytes of the whole parameters gathered now (storages resized past the allocator's
        view of a step's operators)."""
        return sum(f.untyped_storage().nbytes() for f in self.flat)
