"""Gradient reduction over the DP group, bucket by bucket while backward still runs.

Gradients accumulate in one fp32 flat buffer per bucket ("whole": every parameter of the
bucket). Two strategies:

ReplicatedGrads  stages 0-1: the whole buffer is persistent and accumulates the micro-batches;
                 only the last one communicates. Stage 0 all-reduces it (DDP); stage 1
                 reduce-scatters it in place, since only this rank's chunk is stepped.
ShardedGrads     stages 2-3: the whole buffer is transient (taken from the pool when the first
                 gradient of the bucket arrives) and reduce-scattered into a persistent shard
                 in every micro-batch, which the shard accumulates (as DeepSpeed's ZeRO-2); it
                 goes back to the pool as soon as its reduction is done, so a whole gradient
                 never outlives its bucket's backward, with or without accumulation.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch
from torch import Tensor, nn

from tpformer.engine.compression import Bf16Reduction, PowerSGD
from tpformer.engine.flat_buffer import BufferPool, FlatBucket, Segment
from tpformer.parallel.comm import (
    Pending,
    all_reduce_async,
    all_reduce_coalesced,
    reduce_scatter_async,
    wait,
)
from tpformer.parallel.context import ParallelContext
from tpformer.parallel.handle import GroupHandle
from tpformer.parallel.param_info import param_info


@dataclass
class PendingReduction:
    """A bucket's reduction in flight: launched once per step, waited for before the update."""

    work: Pending | None = None
    launched: bool = False


class ReplicatedGrads:
    """Stages 0-1 (see the module docstring). `sharded` selects stage 1's in-place
    reduce-scatter, whose result is this rank's chunk of the whole buffer. `bf16` sends the
    reduction in bfloat16; `powersgd` replaces it by PowerSGD's (engine/compression.py)."""

    every_micro_batch = False
    """Whether buckets are reduced in every micro-batch (else only in the last one's backward)."""

    def __init__(
        self,
        buckets: list[FlatBucket],
        dp: GroupHandle,
        device: torch.device,
        pool: BufferPool,
        *,
        sharded: bool,
        bf16: bool = False,
        powersgd: PowerSGD | None = None,
    ) -> None:
        self.buckets, self.dp, self.device, self.pool = buckets, dp, device, pool
        self.sharded, self.bf16, self.powersgd = sharded, bf16, powersgd
        self.whole: list[Tensor | None] = [None] * len(buckets)
        self.pending = [PendingReduction() for _ in buckets]
        self.stale: list[set[int]] = [set() for _ in buckets]
        """Segments whose part of the persistent buffer still holds the previous step's values:
        the first gradient of a step is copied over them (no zeroing pass over every buffer),
        and the reduction zeroes those that got none."""

    def _whole(self, i: int) -> Tensor:
        """Bucket i's full gradient buffer, which exists once a gradient reached the bucket."""
        whole = self.whole[i]
        assert whole is not None, f"bucket {i} has no gradient buffer yet"
        return whole

    def accumulate(self, i: int, seg: Segment, grad: Tensor) -> None:
        if self.whole[i] is None:
            self.whole[i] = self.pool.take(
                self.buckets[i].padded_numel, torch.float32, self.device, zero=True
            )
        view = self.buckets[i].view(self._whole(i), seg)
        if seg.offset not in self.stale[i]:
            view.add_(grad)
            return
        self.stale[i].discard(seg.offset)
        if grad.is_sparse:  # row-sparse (an embedding): only its rows are written
            view.zero_().add_(grad)
        else:
            view.copy_(grad)

    def launch(self, i: int) -> None:
        """Start bucket i's reduction (once per step; nothing to do if it has no gradient)."""
        pending = self.pending[i]
        if pending.launched or self.whole[i] is None:
            return
        self._zero_stale(i)
        pending.launched = True
        pending.work = self._reduce(i)

    def _zero_stale(self, i: int) -> None:
        for seg in self.buckets[i].segments:
            if seg.offset in self.stale[i]:
                self.buckets[i].view(self._whole(i), seg).zero_()
        self.stale[i].clear()

    def _reduce(self, i: int) -> Pending | None:
        whole = self._whole(i)
        if self.powersgd is not None:  # synchronous: the whole buffer gets the (approximate) sum
            self.powersgd.reduce(i, whole)
            return None
        if self.bf16:
            return Bf16Reduction(
                whole,
                self.buckets[i].shard_of(whole) if self.sharded else None,
                self.buckets[i],
                self.dp,
            )
        if self.sharded:  # only this rank's part is stepped: reduce it in place
            return reduce_scatter_async(self.buckets[i].shard_of(whole), whole, self.dp)
        return all_reduce_async(whole, self.dp)

    def reduced(self, i: int) -> Tensor:
        """Wait for bucket i's reduction; its summed gradient over the part this rank steps.

        A bucket that launched nothing this step (no gradient reached it, or the last backward
        had sync=False) is reduced now, as zeros if it never got a gradient."""
        if not self.pending[i].launched:
            if self.whole[i] is None:
                self.whole[i] = torch.zeros(
                    self.buckets[i].padded_numel, dtype=torch.float32, device=self.device
                )
            self.launch(i)
        wait(self.pending[i].work)
        self.pending[i] = PendingReduction()
        return self._result(i)

    def _result(self, i: int) -> Tensor:
        whole = self._whole(i)
        return self.buckets[i].shard_of(whole) if self.sharded else whole

    def zero(self) -> None:
        """Clear the accumulators for the next step (the buffers stay allocated): each
        segment's next gradient overwrites it, the padding is zeroed now."""
        for i, (bucket, whole) in enumerate(zip(self.buckets, self.whole)):
            if whole is not None:
                whole[bucket.numel :].zero_()
                self.stale[i] = {seg.offset for seg in bucket.segments}

    def whole_buffers_held(self) -> int:
        """How many buckets hold a whole (unreduced) gradient buffer right now."""
        return sum(w is not None for w in self.whole)

    def nbytes(self) -> int:
        """Bytes held between steps."""
        return sum(w.numel() * w.element_size() for w in self.whole if w is not None)


class ShardedGrads(ReplicatedGrads):
    """Stages 2-3 (see the module docstring): whole buffers are transient, shards persistent.
    A bucket's reduction runs in every micro-batch: the first of a step reduce-scatters into
    the shard, later ones into a pooled buffer that is added to it once done (with one
    micro-batch per step this is exactly one reduce-scatter into the shard)."""

    every_micro_batch = True

    def __init__(
        self,
        buckets: list[FlatBucket],
        dp: GroupHandle,
        device: torch.device,
        pool: BufferPool,
        *,
        bf16: bool = False,
    ) -> None:
        super().__init__(buckets, dp, device, pool, sharded=True, bf16=bf16)
        self.shard = [
            torch.zeros(b.shard_size, dtype=torch.float32, device=device) for b in buckets
        ]
        self.summed = [False] * len(buckets)
        """The shard already holds an earlier micro-batch's sum this step."""
        self.incoming: list[Tensor | None] = [None] * len(buckets)
        """Where a later micro-batch's reduction lands before it is added to the shard."""

    def accumulate(self, i: int, seg: Segment, grad: Tensor) -> None:
        if self.pending[i].launched:  # the previous micro-batch's sum of this bucket
            self._retire(i)
        super().accumulate(i, seg, grad)

    def _reduce(self, i: int) -> Pending | None:
        if self.summed[i]:
            out = self.pool.take(self.buckets[i].shard_size, torch.float32, self.device, zero=False)
            self.incoming[i] = out
        else:
            out, self.summed[i] = self.shard[i], True
        work: Pending | None
        if self.bf16:
            work = Bf16Reduction(self._whole(i), out, self.buckets[i], self.dp)
        else:
            work = reduce_scatter_async(out, self._whole(i), self.dp)
        self._retire_reductions(but=i)
        return work

    def _retire(self, i: int) -> None:
        """Finish bucket i's reduction: wait, add a later micro-batch's sum into the shard,
        return the whole buffer to the pool; the bucket can then be reduced again."""
        pending = self.pending[i]
        wait(pending.work)
        self.pending[i] = PendingReduction()
        incoming = self.incoming[i]
        if incoming is not None:
            self.shard[i].add_(incoming)
            self.pool.give(incoming)
            self.incoming[i] = None
        self._release(i)

    def _retire_reductions(self, but: int) -> None:
        """Finish the reductions launched before bucket `but`'s and return their whole buffers,
        so the next bucket reuses them: besides the root's (filled from the heads to the
        embeddings), at most two blocks' whole gradients coexist, the one in flight and the one
        filling. The previous bucket's reduction had a whole block's backward to finish, so the
        wait is normally free; it is a wait, not a poll, because gloo's point-to-point work
        reports completion only once waited for."""
        for i, pending in enumerate(self.pending):
            if i != but and pending.launched:
                self._retire(i)

    def reduced(self, i: int) -> Tensor:
        """The shard of bucket i's gradient summed over DP and this step's micro-batches."""
        if self.pending[i].launched:
            self._retire(i)
        elif self.whole[i] is not None or not self.summed[i]:  # unreduced, or never a gradient
            if self.whole[i] is None:
                self.whole[i] = self.pool.take(
                    self.buckets[i].padded_numel, torch.float32, self.device, zero=True
                )
            self.launch(i)
            self._retire(i)
        return self.shard[i]

    def _release(self, i: int) -> None:
        self.pool.give(self.whole[i])  # None when already released after its reduction
        self.whole[i] = None

    def zero(self) -> None:
        for i, shard in enumerate(self.shard):
            shard.zero_()
            self._release(i)
            self.summed[i] = False

    def nbytes(self) -> int:
        return sum(s.numel() * s.element_size() for s in self.shard)


class SequenceParallelGrads:
    """Sums over the TP group the gradients of parameters that act on sequence-sharded
    activations (marked by `mark_sequence_parallel`): each TP rank's covers only its chunk of
    the sequence. One all-reduce per step over all of them, on the part of each bucket this rank
    steps (flat layouts are identical across a TP group), as Megatron's finalize_model_grads."""

    def __init__(self, buckets: list[FlatBucket], tp: GroupHandle, *, whole: bool) -> None:
        self.tp = tp
        self.pieces: list[tuple[int, int, int]] = []
        """(bucket, start, stop) of each marked parameter inside the stepped part."""
        if tp.size == 1:
            return
        for i, bucket in enumerate(buckets):
            lo = 0 if whole else bucket.shard_start
            hi = bucket.padded_numel if whole else bucket.shard_start + bucket.shard_size
            for seg in bucket.segments:
                start, stop = max(seg.offset, lo), min(seg.offset + seg.numel, hi)
                if param_info(seg.param).sequence_parallel and start < stop:
                    self.pieces.append((i, start - lo, stop - lo))

    def sum_over_tp(self, grads: list[Tensor]) -> None:
        """In place on `grads` (one per bucket, as the optimizer steps them)."""
        all_reduce_coalesced([grads[i][a:b] for i, a, b in self.pieces], self.tp)


class PipelineTiedGrads:
    """Sums over a pipeline's first and last stage the gradient of the parameters both hold
    (the word embedding, which the last stage also uses as output projection), as Megatron's
    embedding group: each end then applies the same update. The tied parameters have a bucket
    of their own (units.py), laid out and sharded identically on both ends."""

    def __init__(self, buckets: list[FlatBucket], ends: GroupHandle) -> None:
        self.ends = ends
        self.indices = [
            i
            for i, b in enumerate(buckets)
            if ends.size > 1 and all(param_info(s.param).pipeline_tied for s in b.segments)
        ]

    def sum_over_ends(self, grads: list[Tensor]) -> None:
        if self.indices:
            all_reduce_coalesced([grads[i] for i in self.indices], self.ends)


@runtime_checkable
class RowSparseLookup(Protocol):
    """A lookup table that can give row-sparse weight gradients (nn.Embedding's and
    VocabParallelEmbedding's `sparse`): the engine's hooks add them into its buffers, so on
    the CPU it turns them on instead of a dense table allocated, zeroed and added every
    backward. Not on accelerators: adding a sparse gradient coalesces it, which reads its count
    of distinct rows on the host (a device sync; the dry run's meta device refuses it)."""

    sparse: bool


def use_sparse_lookups(model: nn.Module) -> None:
    """Turn on row-sparse weight gradients of every RowSparseLookup of the model (the CPU)."""
    for module in model.modules():
        if isinstance(module, RowSparseLookup) and isinstance(module.sparse, bool):
            module.sparse = True


def build_grads(
    buckets: list[FlatBucket],
    ctx: ParallelContext,
    pool: BufferPool,
    *,
    stage: int,
    compression: str,
    powersgd_rank: int,
    powersgd_start_step: int,
) -> ShardedGrads | ReplicatedGrads:
    """The engine's gradient buffers: stages 2-3 reduce-scatter into shards every micro-batch;
    0-1 keep whole buffers, reduced (optionally compressed) after the last micro-batch.
    Compression acts on the DP x CP reduction only."""
    compress = compression if ctx.replicas.size > 1 else "none"
    bf16 = compress == "bf16"
    if stage >= 2:
        return ShardedGrads(buckets, ctx.replicas, ctx.device, pool, bf16=bf16)
    powersgd = (
        PowerSGD(
            buckets,
            ctx.replicas,
            ctx.tp,
            rank=powersgd_rank,
            start_step=powersgd_start_step,
            seed=ctx.rng.seed,
            device=ctx.device,
        )
        if compress == "powersgd"
        else None
    )
    return ReplicatedGrads(
        buckets, ctx.replicas, ctx.device, pool, sharded=stage == 1, bf16=bf16, powersgd=powersgd
    )
