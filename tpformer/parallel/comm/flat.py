"""Flat-buffer collectives of the DP/ZeRO engine. They return a work handle (or None when the
group has size 1) so the engine can overlap them with backward; `wait(handle)` completes one."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor

from tpformer.parallel.comm.record import Pending, Timed, record
from tpformer.parallel.comm.shortcuts import (
    AllReduceThenSlice,
    PairExchange,
    gloo_shortcuts,
    pairwise,
    swap_sum,
    swaps,
)
from tpformer.parallel.handle import GroupHandle

_reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def all_reduce_async(x: Tensor, handle: GroupHandle) -> Pending | None:
    """Start an in-place SUM all-reduce of a flat buffer."""
    if handle.size == 1:
        return None
    record("all_reduce", handle, x, x.nbytes)
    if swaps(x, handle):
        return swap_sum(x, handle)
    return Timed(dist.all_reduce(x, group=handle.group, async_op=True), x.device, handle)


def reduce_scatter_async(out: Tensor, x: Tensor, handle: GroupHandle) -> Pending | None:
    """Start a SUM reduce-scatter: `out` (numel x.numel() / size) gets this rank's chunk.

    `out` may be this rank's own chunk of `x` (in place, as NCCL allows). The rest of `x` is
    scratch after: partial sums, or on gloo the whole reduced buffer (see AllReduceThenSlice).
    """
    if handle.size == 1:
        out.copy_(x)
        return None
    record("reduce_scatter", handle, x, x.nbytes)
    if pairwise(handle):
        mine, theirs = x.chunk(2) if handle.rank == 0 else reversed(x.chunk(2))
        in_place = out.data_ptr() == mine.data_ptr()  # then the peer's half lands beside it
        recv = torch.empty_like(out) if in_place else out
        addend = recv if in_place else mine
        return PairExchange(
            theirs,
            recv,
            handle,
            finish=lambda: out.add_(addend),
        )
    if gloo_shortcuts(handle):
        work = dist.all_reduce(x, group=handle.group, async_op=True)
        return AllReduceThenSlice(work, out, x, handle)
    return Timed(_reduce_scatter(out, x, group=handle.group, async_op=True), out.device, handle)


def all_gather_async(out: Tensor, shard: Tensor, handle: GroupHandle) -> Pending | None:
    """Start an all-gather of equal flat shards into `out` (numel shard.numel() * size)."""
    if handle.size == 1:
        out.copy_(shard)
        return None
    record("all_gather", handle, out, out.nbytes)
    if pairwise(handle):
        chunks = out.chunk(2)
        chunks[handle.rank].copy_(shard)
        return PairExchange(shard, chunks[1 - handle.rank], handle)
    return Timed(_all_gather(out, shard, group=handle.group, async_op=True), out.device, handle)


def wait(work: Pending | None) -> None:
    if work is not None:
        work.wait()
