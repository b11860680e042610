"""Autograd-aware collectives over the TP group: the only place that calls torch.distributed ops.

Each public function takes a GroupHandle and returns its input untouched when the group has
size 1, so the single-process model runs the same code. Every collective issued is reported
to the counters opened with `count_collectives()`, which the tests use to assert the exact
communication of a layer or model.

Sequence parallelism will add the pair reduce-scatter / all-gather along the sequence dim here.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
import torch.distributed as dist
from torch import Tensor

from tpformer.parallel.context import GroupHandle

_active_counters: list[Counter[str]] = []


@contextmanager
def count_collectives() -> Iterator[Counter[str]]:
    """Count the collectives issued inside the block, keyed by op name ("all_reduce", ...)."""
    counter: Counter[str] = Counter()
    _active_counters.append(counter)
    try:
        yield counter
    finally:
        _active_counters.remove(counter)


def _record(op: str) -> None:
    for counter in _active_counters:
        counter[op] += 1


def all_reduce(x: Tensor, handle: GroupHandle, op: dist.ReduceOp.RedOpType = dist.ReduceOp.SUM) -> Tensor:
    """In-place all-reduce without autograd (for statistics such as a max or a norm)."""
    if handle.size == 1:
        return x
    _record("all_reduce")
    dist.all_reduce(x, op=op, group=handle.group)
    return x


def all_gather_dim(x: Tensor, handle: GroupHandle, dim: int = -1) -> Tensor:
    """Concatenate every rank's x along `dim` (no autograd)."""
    if handle.size == 1:
        return x
    _record("all_gather")
    parts = [torch.empty_like(x) for _ in range(handle.size)]
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
    def forward(ctx, x: Tensor, handle: GroupHandle) -> Tensor:  # type: ignore[override]
        ctx.handle = handle
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None]:  # type: ignore[override]
        return all_reduce(grad.contiguous(), ctx.handle), None


class _ReduceFromTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, handle: GroupHandle) -> Tensor:  # type: ignore[override]
        return all_reduce(x.contiguous().clone(), handle)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None]:  # type: ignore[override]
        return grad, None


class _ScatterToTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, handle: GroupHandle) -> Tensor:  # type: ignore[override]
        ctx.handle = handle
        return _split_last_dim(x, handle)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None]:  # type: ignore[override]
        return all_gather_dim(grad, ctx.handle), None


class _GatherFromTP(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, handle: GroupHandle) -> Tensor:  # type: ignore[override]
        ctx.handle = handle
        return all_gather_dim(x, handle)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None]:  # type: ignore[override]
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


# ----------------------------------------------------------------------------- data parallel
# Flat-buffer collectives of the DP/ZeRO engine. They return a work handle (or None when the
# group has size 1) so the engine can overlap them with backward; `wait(handle)` completes one.

_reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def all_reduce_async(x: Tensor, handle: GroupHandle) -> dist.Work | None:
    """Start an in-place SUM all-reduce of a flat buffer."""
    if handle.size == 1:
        return None
    _record("all_reduce")
    return dist.all_reduce(x, group=handle.group, async_op=True)


class _AllReduceThenSlice:
    """A reduce-scatter done as an in-place all-reduce plus a copy of this rank's chunk.

    gloo's reduce-scatter is about 2x slower than its all-reduce on the same buffer (measured
    on CPU, 32 MB, 2 ranks: 52 ms vs 27 ms), so on gloo this is the faster way to the same sums.
    """

    def __init__(self, work: dist.Work, out: Tensor, x: Tensor, rank: int) -> None:
        self.work, self.out, self.x, self.rank = work, out, x, rank

    def wait(self) -> None:
        self.work.wait()
        n = self.out.numel()
        self.out.copy_(self.x[self.rank * n : (self.rank + 1) * n])


class _PairExchange:
    """Two ranks swap one chunk each with point-to-point send/recv; `wait` completes both
    directions and then runs `finish` (the local add of a reduce-scatter)."""

    def __init__(self, send: Tensor, recv: Tensor, handle: GroupHandle,
                 finish: Callable[[], None] | None = None) -> None:
        peer = 1 - handle.rank
        self.works = dist.batch_isend_irecv([
            dist.P2POp(dist.isend, send, group=handle.group, group_peer=peer),
            dist.P2POp(dist.irecv, recv, group=handle.group, group_peer=peer)])
        self.finish = finish

    def wait(self) -> None:
        for work in self.works:
            work.wait()
        if self.finish is not None:
            self.finish()


def _pairwise(handle: GroupHandle) -> bool:
    """gloo with two ranks: a swap of halves moves half the bytes of gloo's ring collectives
    and runs on gloo's transport without its collective algorithms (measured on CPU, 32 MB,
    2 ranks: exchange 17.7 ms vs all-reduce 29.6 ms and all_gather_into_tensor 44.0 ms)."""
    return handle.size == 2 and dist.get_backend(handle.group) == "gloo"


def reduce_scatter_async(out: Tensor, x: Tensor, handle: GroupHandle) -> dist.Work | None:
    """Start a SUM reduce-scatter: `out` (numel x.numel() / size) gets this rank's chunk.

    `out` may be this rank's own chunk of `x` (in place, as NCCL allows). The rest of `x` is
    scratch after: partial sums, or on gloo the whole reduced buffer (see _AllReduceThenSlice).
    """
    if handle.size == 1:
        out.copy_(x)
        return None
    _record("reduce_scatter")
    if _pairwise(handle):
        mine, theirs = x.chunk(2) if handle.rank == 0 else reversed(x.chunk(2))
        in_place = out.data_ptr() == mine.data_ptr()  # then the peer's half lands beside it
        recv = torch.empty_like(out) if in_place else out
        addend = recv if in_place else mine
        return _PairExchange(theirs, recv, handle,  # type: ignore[return-value]
                             finish=lambda: out.add_(addend))
    if dist.get_backend(handle.group) == "gloo":
        work = dist.all_reduce(x, group=handle.group, async_op=True)
        return _AllReduceThenSlice(work, out, x, handle.rank)  # type: ignore[return-value]
    return _reduce_scatter(out, x, group=handle.group, async_op=True)


def all_gather_async(out: Tensor, shard: Tensor, handle: GroupHandle) -> dist.Work | None:
    """Start an all-gather of equal flat shards into `out` (numel shard.numel() * size)."""
    if handle.size == 1:
        out.copy_(shard)
        return None
    _record("all_gather")
    if _pairwise(handle):
        chunks = out.chunk(2)
        chunks[handle.rank].copy_(shard)
        return _PairExchange(shard, chunks[1 - handle.rank], handle)  # type: ignore[return-value]
    return _all_gather(out, shard, group=handle.group, async_op=True)


def wait(work: dist.Work | None) -> None:
    if work is not None:
        work.wait()


def broadcast_object(obj: object, *, src: int = 0) -> object:
    """Global rank `src`'s picklable object on every rank (a no-op without torch.distributed)."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return obj
    _record("broadcast")
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def all_gather_object(obj: object, handle: GroupHandle) -> list[object]:
    """Every rank's picklable object of the group, in group-rank order."""
    if handle.size == 1:
        return [obj]
    _record("all_gather_object")
    out: list[object] = [None] * handle.size
    dist.all_gather_object(out, obj, group=handle.group)
    return out
