"""Megatron-SP: between the tensor-parallel regions, activations [b, s, h] hold only this rank's
contiguous sequence chunk [b, s/tp, h] (rank r: positions r*s/tp .. (r+1)*s/tp - 1). The
column-parallel linear all-gathers the sequence (layers/linear.py), the row-parallel one leaves
through reduce_scatter_sequence along dim 1: the bytes of TP's all-reduce pair, and the regions
between hold 1/tp of the sequence."""

from __future__ import annotations

import torch
import torch.distributed._functional_collectives as funcol
from torch import Tensor

from tpformer.parallel.comm.flat import all_gather_async, reduce_scatter_async, wait
from tpformer.parallel.comm.record import process_group, traced
from tpformer.parallel.handle import GroupHandle

SEQUENCE_DIM = 1
"""Activations are [batch, seq, hidden]: sequence parallelism splits dim 1."""


def sequence_range(local_len: int, tp: GroupHandle) -> tuple[int, int]:
    """Global [start, stop) of the positions this rank holds in a sequence-sharded region."""
    return tp.rank * local_len, (tp.rank + 1) * local_len


def _sequence_major(x: Tensor, size: int) -> Tensor:
    """[b, s, ...] -> contiguous [size, b, s/size, ...]: each rank's chunk back to back."""
    b, s = x.shape[0], x.shape[SEQUENCE_DIM]
    if s % size:
        raise ValueError(
            f"sequence length {s} is not divisible by tp={size} "
            "(sequence parallelism splits the sequence across the TP group)"
        )
    return x.reshape(b, size, s // size, *x.shape[2:]).transpose(0, 1).contiguous()


class SequenceGather:
    """An all-gather of [b, s/tp, ...] chunks along the sequence, started at construction (no
    autograd); `result()` waits and returns [b, s, ...]. Identity on one rank."""

    def __init__(self, x: Tensor, handle: GroupHandle) -> None:
        self.single, self.x = handle.size == 1, x
        if self.single:
            return
        if traced():  # the graph's own collective: `result` returns it
            self.single = True
            self.x = funcol.all_gather_tensor(x.contiguous(), SEQUENCE_DIM, process_group(handle))
            return
        self.out = torch.empty((handle.size, *x.shape), dtype=x.dtype, device=x.device)
        self.work = all_gather_async(self.out.view(-1), x.contiguous().view(-1), handle)

    def result(self) -> Tensor:
        if self.single:
            return self.x
        wait(self.work)
        return self.out.transpose(0, 1).reshape(self.x.shape[0], -1, *self.x.shape[2:])


class SequenceReduceScatter:
    """A SUM reduce-scatter of [b, s, ...] along the sequence, started at construction (no
    autograd); `result()` waits and returns this rank's chunk [b, s/tp, ...]."""

    def __init__(self, x: Tensor, handle: GroupHandle) -> None:
        self.single, self.x = handle.size == 1, x
        if self.single:
            return
        if traced():  # the graph's own collective: `result` returns it
            self.single = True
            group = process_group(handle)
            self.x = funcol.reduce_scatter_tensor(x.contiguous(), "sum", SEQUENCE_DIM, group)
            return
        chunks = _sequence_major(x, handle.size)
        self.out = torch.empty(chunks.shape[1:], dtype=x.dtype, device=x.device)
        self.work = reduce_scatter_async(self.out.view(-1), chunks.view(-1), handle)

    def result(self) -> Tensor:
        if self.single:
            return self.x
        wait(self.work)
        return self.out


class _ReduceScatterSequence(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, handle: GroupHandle) -> Tensor:
        ctx.handle = handle
        return SequenceReduceScatter(x, handle).result()

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None]:
        return SequenceGather(grad, ctx.handle).result(), None


def reduce_scatter_sequence(x: Tensor, tp: GroupHandle) -> Tensor:
    """Leave a row-parallel region into the sequence-sharded one: sum the partial [b, s, ...]
    over TP and keep this rank's chunk [b, s/tp, ...]; backward all-gathers the gradient."""
    return x if tp.size == 1 else _ReduceScatterSequence.apply(x, tp)
