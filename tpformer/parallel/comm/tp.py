"""Tensor parallelism's collectives: plain ones for statistics, and the autograd functions that
enter and leave TP regions (copy_to_tp / reduce_from_tp: one all-reduce each way; scatter and
gather along the last dim; the first rank's tensor on every rank)."""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch import Tensor

from tpformer.parallel.comm.record import (
    FUNCTIONAL_OPS,
    process_group,
    record,
    traced,
    waiting,
)
from tpformer.parallel.comm.shortcuts import PairExchange, swap_sum, swaps
from tpformer.parallel.handle import GroupHandle


def all_reduce(
    x: Tensor, handle: GroupHandle, op: dist.ReduceOp.RedOpType = dist.ReduceOp.SUM
) -> Tensor:
    """In-place all-reduce without autograd (for statistics such as a max or a norm)."""
    if handle.size == 1:
        return x
    if traced():
        return x.copy_(funcol.all_reduce(x, FUNCTIONAL_OPS[op], process_group(handle)))
    record("all_reduce", handle, x, x.nbytes)
    if op == dist.ReduceOp.SUM and swaps(x, handle):
        swap_sum(x, handle).wait()
        return x
    with waiting(handle, x.device):
        dist.all_reduce(x, op=op, group=handle.group)
    return x


def summed(x: Tensor, handle: GroupHandle) -> Tensor:
    """The SUM of a contiguous x over the group, as a new tensor (x is left as it is)."""
    if handle.size > 1 and traced():
        return funcol.all_reduce(x, "sum", process_group(handle))
    if handle.size > 1 and swaps(x, handle):
        record("all_reduce", handle, x, x.nbytes)
        theirs = torch.empty_like(x)
        PairExchange(x, theirs, handle).wait()
        return x + theirs
    return all_reduce(x.clone(), handle)


def all_reduce_coalesced(tensors: list[Tensor], handle: GroupHandle) -> None:
    """SUM all-reduce of several tensors (or views, written through) as one flat buffer."""
    if handle.size == 1 or not tensors:
        return
    flat = all_reduce(torch.cat([t.reshape(-1) for t in tensors]), handle)
    offset = 0
    for t in tensors:
        t.copy_(flat[offset : offset + t.numel()].view_as(t))
        offset += t.numel()


def all_gather_dim(x: Tensor, handle: GroupHandle, dim: int = -1) -> Tensor:
    """Concatenate every rank's x along `dim` (no autograd)."""
    if handle.size == 1:
        return x
    if traced():
        return funcol.all_gather_tensor(x.contiguous(), dim % x.dim(), process_group(handle))
    record("all_gather", handle, x, x.nbytes * handle.size)
    parts = [torch.empty_like(x) for _ in range(handle.size)]
    with waiting(handle, x.device):
        dist.all_gather(parts, x.contiguous(), group=handle.group)
    return torch.cat(parts, dim=dim)


def _split_last_dim(x: Tensor, handle: GroupHandle) -> Tensor:
    width = x.shape[-1]
    if width % handle.size != 0:
        raise ValueError(f"last dim {width} is not divisible by tp={handle.size}")
    chunk = width // handle.size
    return x[..., handle.rank * chunk : (handle.rank + 1) * chunk].contiguous()


class _CopyToTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, handle: GroupHandle) -> Tensor:
        ctx.handle = handle
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None]:
        return all_reduce(grad.contiguous(), ctx.handle), None


class _ReduceFromTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, handle: GroupHandle) -> Tensor:
        return summed(x.contiguous(), handle)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None]:
        return grad, None


class _ScatterToTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, handle: GroupHandle) -> Tensor:
        ctx.handle = handle
        return _split_last_dim(x, handle)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None]:
        return all_gather_dim(grad, ctx.handle), None


class _GatherFromTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, handle: GroupHandle) -> Tensor:
        ctx.handle = handle
        return all_gather_dim(x, handle)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None]:
        return _split_last_dim(grad, ctx.handle), None


def copy_to_tp(x: Tensor, tp: GroupHandle) -> Tensor:
    """Enter a TP region: identity forward, all-reduce of the gradient in backward."""
    return x if tp.size == 1 else _CopyToTP.apply(x, tp)


def reduce_from_tp(x: Tensor, tp: GroupHandle) -> Tensor:
    """Leave a TP region by summing partial results: all-reduce forward, identity backward."""
    return x if tp.size == 1 else _ReduceFromTP.apply(x, tp)


def scatter_to_tp(x: Tensor, tp: GroupHandle) -> Tensor:
    """Keep this rank's chunk of the last dim; backward all-gathers the gradient."""
    return x if tp.size == 1 else _ScatterToTP.apply(x, tp)


def gather_from_tp(x: Tensor, tp: GroupHandle) -> Tensor:
    """All-gather the last dim from every TP rank; backward keeps this rank's chunk."""
    return x if tp.size == 1 else _GatherFromTP.apply(x, tp)


class _FromFirstRank(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, handle: GroupHandle) -> Tensor:
        ctx.first = handle.rank == 0
        y = x.contiguous().clone()
        record("broadcast", handle, y, y.nbytes)
        with waiting(handle, y.device):
            dist.broadcast(y, group=handle.group, group_src=0)
        return y

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None]:
        return (grad if ctx.first else torch.zeros_like(grad)), None


def from_first_rank(x: Tensor, tp: GroupHandle) -> Tensor:
    """TP group rank 0's x on every rank (a broadcast); backward: the gradient reaches rank 0's
    input only (the others' inputs were placeholders)."""
    return x if tp.size == 1 else _FromFirstRank.apply(x, tp)
