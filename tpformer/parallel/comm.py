"""Autograd-aware collectives over the TP group: the only place that calls torch.distributed ops.

Each public function takes a GroupHandle and returns its input untouched when the group has
size 1, so the single-process model runs the same code. Every collective issued is reported
to the counters opened with `count_collectives()`, which the tests use to assert the exact
communication of a layer or model, in calls and in bytes.

Tensor parallelism enters and leaves its regions with copy_to_tp / reduce_from_tp (one
all-reduce each way); sequence parallelism replaces that pair with an all-gather (inside the
column-parallel linear, layers/linear.py) and reduce_scatter_sequence along dim 1 of
[batch, seq, hidden] activations (same bytes, and the regions between hold 1/tp of the
sequence).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Protocol, TypeVar, cast

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch import Tensor

from tpformer.parallel.context import GroupHandle
from tpformer.parallel.hang_report import RECORDER
from tpformer.parallel.wait_clock import WAIT_CLOCK

T = TypeVar("T")

SEQUENCE_DIM = 1
"""Activations are [batch, seq, hidden]: sequence parallelism splits dim 1."""


class CollectiveCounts(Counter):
    """Calls per op name ("all_reduce", ...), and in `bytes` the bytes each rank sends per op
    under the ring model: (n-1)/n of the full tensor for an all-gather or a reduce-scatter,
    twice that for an all-reduce (which is one of each)."""

    def __init__(self) -> None:
        super().__init__()
        self.bytes: dict[str, float] = cast("dict[str, float]", Counter())  # float bytes


_active_counters: list[CollectiveCounts] = []


class Pending(Protocol):
    """Work in flight that `wait()` completes: a torch.distributed Work, or one of this module's
    composite operations (a pair swap, an all-reduce then slice)."""

    def wait(self) -> Any: ...


def _started(work: dist.Work | None) -> dist.Work:
    """An async_op=True call's Work (torch types it Optional; it is None only without async_op)."""
    assert work is not None
    return work


class _Timed:
    """A torch.distributed Work whose wait is reported to the wait clock."""

    def __init__(self, work: dist.Work | None, device: torch.device) -> None:
        self.work, self.device = _started(work), device

    def wait(self) -> None:
        with WAIT_CLOCK.waiting(self.device):
            self.work.wait()


def process_group(handle: GroupHandle) -> dist.ProcessGroup:
    """The handle's group; only a size-1 handle has none, and callers return before this."""
    assert handle.group is not None, "a size-1 group has no process group"
    return handle.group


@contextmanager
def count_collectives() -> Iterator[CollectiveCounts]:
    """Count the collectives issued inside the block, keyed by op name ("all_reduce", ...)."""
    counter = CollectiveCounts()
    _active_counters.append(counter)
    try:
        yield counter
    finally:
        _active_counters.remove(counter)


_RING_PASSES = {"all_reduce": 2, "all_gather": 1, "reduce_scatter": 1, "broadcast": 1}


def traced() -> bool:
    """Inside a graph torch.compile is capturing (trainer.compile's blocks): the collectives
    below then issue PyTorch's functional collectives, which the graph holds and inductor
    schedules, and are neither counted nor timed (host code a graph would break on)."""
    return torch.compiler.is_compiling()


_FUNCTIONAL_OPS = {dist.ReduceOp.SUM: "sum", dist.ReduceOp.MAX: "max"}


def _record(
    op: str, handle: GroupHandle | None, x: Tensor | None = None, full_bytes: int = 0
) -> None:
    """One call of `op` on the handle's group (None: the world) over a full tensor of
    `full_bytes`: counted for `count_collectives` and kept in the hang report's recorder."""
    if traced():
        return
    size = handle.size if handle is not None else 1
    RECORDER.record(
        op, handle.group if handle is not None else None, tuple(x.shape) if x is not None else ()
    )
    sent = _RING_PASSES.get(op, 0) * full_bytes * (size - 1) / size
    for counter in _active_counters:
        counter[op] += 1
        counter.bytes[op] += sent


def all_reduce(
    x: Tensor, handle: GroupHandle, op: dist.ReduceOp.RedOpType = dist.ReduceOp.SUM
) -> Tensor:
    """In-place all-reduce without autograd (for statistics such as a max or a norm)."""
    if handle.size == 1:
        return x
    if traced():
        return x.copy_(funcol.all_reduce(x, _FUNCTIONAL_OPS[op], process_group(handle)))
    _record("all_reduce", handle, x, x.nbytes)
    if op == dist.ReduceOp.SUM and _swaps(x, handle):
        _swap_sum(x, handle).wait()
        return x
    with WAIT_CLOCK.waiting(x.device):
        dist.all_reduce(x, op=op, group=handle.group)
    return x


def summed(x: Tensor, handle: GroupHandle) -> Tensor:
    """The SUM of a contiguous x over the group, as a new tensor (x is left as it is)."""
    if handle.size > 1 and traced():
        return funcol.all_reduce(x, "sum", process_group(handle))
    if handle.size > 1 and _swaps(x, handle):
        _record("all_reduce", handle, x, x.nbytes)
        theirs = torch.empty_like(x)
        _PairExchange(x, theirs, handle).wait()
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
    _record("all_gather", handle, x, x.nbytes * handle.size)
    parts = [torch.empty_like(x) for _ in range(handle.size)]
    with WAIT_CLOCK.waiting(x.device):
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


# ----------------------------------------------------------------------------- data parallel
# Flat-buffer collectives of the DP/ZeRO engine. They return a work handle (or None when the
# group has size 1) so the engine can overlap them with backward; `wait(handle)` completes one.

_reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def all_reduce_async(x: Tensor, handle: GroupHandle) -> Pending | None:
    """Start an in-place SUM all-reduce of a flat buffer."""
    if handle.size == 1:
        return None
    _record("all_reduce", handle, x, x.nbytes)
    if _swaps(x, handle):
        return _swap_sum(x, handle)
    return _Timed(dist.all_reduce(x, group=handle.group, async_op=True), x.device)


class _AllReduceThenSlice:
    """A reduce-scatter done as an in-place all-reduce plus a copy of this rank's chunk.

    gloo's reduce-scatter is about 2x slower than its all-reduce on the same buffer (measured
    on CPU, 32 MB, 2 ranks: 52 ms vs 27 ms), so on gloo this is the faster way to the same sums.
    """

    def __init__(self, work: dist.Work, out: Tensor, x: Tensor, rank: int) -> None:
        self.work, self.out, self.x, self.rank = work, out, x, rank

    def wait(self) -> None:
        with WAIT_CLOCK.waiting(self.out.device):
            self.work.wait()
        n = self.out.numel()
        self.out.copy_(self.x[self.rank * n : (self.rank + 1) * n])


class _PairExchange:
    """Two ranks swap one chunk each with point-to-point send/recv; `wait` completes both
    directions and then runs `finish` (the local add of a reduce-scatter)."""

    def __init__(
        self,
        send: Tensor,
        recv: Tensor,
        handle: GroupHandle,
        finish: Callable[[], object] | None = None,
    ) -> None:
        peer = 1 - handle.rank  # plain isend/irecv: 0.2 ms less per 1.3 MB swap than batched
        self.works = [
            _started(dist.isend(send, group=handle.group, group_dst=peer)),
            _started(dist.irecv(recv, group=handle.group, group_src=peer)),
        ]
        self.finish, self.device = finish, recv.device

    def wait(self) -> None:
        with WAIT_CLOCK.waiting(self.device):
            for work in self.works:
                work.wait()
        if self.finish is not None:
            self.finish()


def _gloo_shortcuts(handle: GroupHandle) -> bool:
    """Whether this group may take the CPU-only shortcuts below (parallel.gloo_shortcuts, on a
    gloo group); without them every collective takes the generic path NCCL takes."""
    return handle.gloo_shortcuts and dist.get_backend(handle.group) == "gloo"


def _pairwise(handle: GroupHandle) -> bool:
    """gloo with two ranks: a swap of halves moves half the bytes of gloo's ring collectives
    and runs on gloo's transport without its collective algorithms (measured on CPU, 32 MB,
    2 ranks: exchange 17.7 ms vs all-reduce 29.6 ms and all_gather_into_tensor 44.0 ms)."""
    return handle.size == 2 and _gloo_shortcuts(handle)


PAIR_SWAP_MAX_BYTES = 8 << 20
"""gloo with two ranks: up to this size a SUM all-reduce is one swap of the whole tensor (each
rank adds the other's; a + b == b + a, so both get the same bits), one round trip instead of
gloo's ring. Measured on the 2-core CPU machine, each after a 1.6 ms matmul as in a layer:
1.5 MB 3.3 ms vs 5.2 ms, 8 MB 8.2 vs 9.3 ms; from 16 MB the ring wins (20.8 vs 13.4 ms)."""


def _swaps(x: Tensor, handle: GroupHandle) -> bool:
    return _pairwise(handle) and x.nbytes <= PAIR_SWAP_MAX_BYTES


def _swap_sum(x: Tensor, handle: GroupHandle) -> _PairExchange:
    """Start x += the peer's x (see PAIR_SWAP_MAX_BYTES); `wait()` completes it."""
    theirs = torch.empty_like(x)
    return _PairExchange(x, theirs, handle, finish=lambda: x.add_(theirs))


def reduce_scatter_async(out: Tensor, x: Tensor, handle: GroupHandle) -> Pending | None:
    """Start a SUM reduce-scatter: `out` (numel x.numel() / size) gets this rank's chunk.

    `out` may be this rank's own chunk of `x` (in place, as NCCL allows). The rest of `x` is
    scratch after: partial sums, or on gloo the whole reduced buffer (see _AllReduceThenSlice).
    """
    if handle.size == 1:
        out.copy_(x)
        return None
    _record("reduce_scatter", handle, x, x.nbytes)
    if _pairwise(handle):
        mine, theirs = x.chunk(2) if handle.rank == 0 else reversed(x.chunk(2))
        in_place = out.data_ptr() == mine.data_ptr()  # then the peer's half lands beside it
        recv = torch.empty_like(out) if in_place else out
        addend = recv if in_place else mine
        return _PairExchange(
            theirs,
            recv,
            handle,
            finish=lambda: out.add_(addend),
        )
    if _gloo_shortcuts(handle):
        work = dist.all_reduce(x, group=handle.group, async_op=True)
        return _AllReduceThenSlice(work, out, x, handle.rank)
    return _Timed(_reduce_scatter(out, x, group=handle.group, async_op=True), out.device)


def all_gather_async(out: Tensor, shard: Tensor, handle: GroupHandle) -> Pending | None:
    """Start an all-gather of equal flat shards into `out` (numel shard.numel() * size)."""
    if handle.size == 1:
        out.copy_(shard)
        return None
    _record("all_gather", handle, out, out.nbytes)
    if _pairwise(handle):
        chunks = out.chunk(2)
        chunks[handle.rank].copy_(shard)
        return _PairExchange(shard, chunks[1 - handle.rank], handle)
    return _Timed(_all_gather(out, shard, group=handle.group, async_op=True), out.device)


def wait(work: Pending | None) -> None:
    if work is not None:
        work.wait()


# ----------------------------------------------------------------------------- sequence parallel
# Megatron-SP: between the tensor-parallel regions, activations [b, s, h] hold only this rank's
# contiguous sequence chunk [b, s/tp, h] (rank r: positions r*s/tp .. (r+1)*s/tp - 1).


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


class _GatherRows(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx,
        rows: Tensor,
        counts: list[int],
        handle: GroupHandle,
    ) -> Tensor:
        ctx.start = sum(counts[: handle.rank])
        ctx.count = counts[handle.rank]
        width = max(counts)
        padded = rows.new_zeros((width, *rows.shape[1:]))
        padded[: rows.shape[0]] = rows
        out = rows.new_empty((handle.size, *padded.shape))
        wait(all_gather_async(out.view(-1), padded.view(-1), handle))
        return torch.cat([out[r, :n] for r, n in enumerate(counts)])

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None, None]:
        return grad[ctx.start : ctx.start + ctx.count], None, None


class _FromFirstRank(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, handle: GroupHandle) -> Tensor:
        ctx.first = handle.rank == 0
        y = x.contiguous().clone()
        _record("broadcast", handle, y, y.nbytes)
        with WAIT_CLOCK.waiting(y.device):
            dist.broadcast(y, group=handle.group, group_src=0)
        return y

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None]:
        return (grad if ctx.first else torch.zeros_like(grad)), None


def reduce_scatter_sequence(x: Tensor, tp: GroupHandle) -> Tensor:
    """Leave a row-parallel region into the sequence-sharded one: sum the partial [b, s, ...]
    over TP and keep this rank's chunk [b, s/tp, ...]; backward all-gathers the gradient."""
    return x if tp.size == 1 else _ReduceScatterSequence.apply(x, tp)


def gather_rows(rows: Tensor, counts: list[int], tp: GroupHandle) -> Tensor:
    """Every rank's rows [counts[r], ...] concatenated in rank order (a replicated result);
    backward keeps this rank's rows of the (replicated) gradient. `counts` must be the same list
    on every rank: one all-gather, padded to the largest count, none when all counts are 0."""
    if tp.size == 1 or max(counts) == 0:
        return rows
    return _GatherRows.apply(rows, counts, tp)


def from_first_rank(x: Tensor, tp: GroupHandle) -> Tensor:
    """TP group rank 0's x on every rank (a broadcast); backward: the gradient reaches rank 0's
    input only (the others' inputs were placeholders)."""
    return x if tp.size == 1 else _FromFirstRank.apply(x, tp)


def broadcast_object(obj: object, *, src: int = 0) -> object:
    """Global rank `src`'s picklable object on every rank (a no-op without torch.distributed)."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return obj
    _record("broadcast", None)
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def all_gather_object(obj: T, handle: GroupHandle) -> list[T]:
    """Every rank's picklable object of the group, in group-rank order."""
    if handle.size == 1:
        return [obj]
    _record("all_gather_object", handle)
    out: list[Any] = [None] * handle.size
    dist.all_gather_object(out, obj, group=handle.group)
    return out


def send_async(x: Tensor, peer: int, handle: GroupHandle, tag: int) -> Pending:
    """Point-to-point send of x to group rank `peer` (a pipeline neighbour); keep x alive until
    the returned work is waited on. `tag` tells gloo's messages apart; NCCL matches by order."""
    _record("send", handle, x)
    for counter in _active_counters:
        counter.bytes["send"] += x.nbytes
    group = process_group(handle)
    work = dist.isend(x.contiguous(), dst=dist.get_global_rank(group, peer), group=group, tag=tag)
    return _Timed(work, x.device)


def recv(out: Tensor, peer: int, handle: GroupHandle, tag: int) -> Tensor:
    """Receive into `out` from group rank `peer`, waiting (up to the group's timeout)."""
    _record("recv", handle, out)
    group = process_group(handle)
    work = dist.irecv(out, src=dist.get_global_rank(group, peer), group=group, tag=tag)
    _Timed(work, out.device).wait()
    return out


class _RingStep:
    """A send to the next ring rank and a receive from the previous one, in flight."""

    def __init__(self, works: list[dist.Work], out: Tensor, sent: Tensor) -> None:
        self.works, self.out, self.sent = works, out, sent  # `sent` kept alive until done

    def wait(self) -> Tensor:
        with WAIT_CLOCK.waiting(self.out.device):
            for work in self.works:
                work.wait()
        return self.out


def ring_shift_async(
    x: Tensor, handle: GroupHandle, *, tag: int, reverse: bool = False
) -> _RingStep:
    """Send x to the next rank of the ring (group rank + 1; the previous one when `reverse`)
    and receive the previous rank's x (the next one's) into a new tensor: one step of ring
    attention. `wait()` returns the received tensor. Counted as a "send" of x's bytes. `tag`
    keeps two rings in flight apart on gloo (keys and their gradients); NCCL matches by order."""
    _record("send", handle, x)
    for counter in _active_counters:
        counter.bytes["send"] += x.nbytes
    group = process_group(handle)
    step = -1 if reverse else 1
    dst = dist.get_global_rank(group, (handle.rank + step) % handle.size)
    src = dist.get_global_rank(group, (handle.rank - step) % handle.size)
    x = x.contiguous()
    out = torch.empty_like(x)
    ops = [
        dist.P2POp(dist.isend, x, dst, group=group, tag=tag),
        dist.P2POp(dist.irecv, out, src, group=group, tag=tag),
    ]
    return _RingStep(dist.batch_isend_irecv(ops), out, x)
