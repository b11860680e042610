"""What every collective reports: the calls and bytes of `count_collectives()` (the tests assert
a layer's communication with it), the hang report's recorder, the wait clock; and `traced()`,
under which the collectives become functional ones inside a torch.compile graph."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any, Protocol, cast

import torch
import torch.distributed as dist
from torch import Tensor

from tpformer.parallel.handle import GroupHandle
from tpformer.parallel.monitor import CommMonitor
from tpformer.parallel.regions import mark, recording


class CollectiveCounts(Counter):
    """Calls per op name ("all_reduce", ...), and in `bytes` the bytes each rank sends per op
    under the ring model: (n-1)/n of the full tensor for an all-gather or a reduce-scatter,
    twice that for an all-reduce (which is one of each)."""

    def __init__(self) -> None:
        super().__init__()
        self.bytes: dict[str, float] = cast("dict[str, float]", Counter())  # float bytes
        self.by_group: Counter[str] = Counter()
        """Calls per "op group" ("all_reduce tp", "send pp", ...; the group as reports call it)."""
        self.group_bytes: dict[str, float] = cast("dict[str, float]", Counter())


active_counters: list[CollectiveCounts] = []


class Pending(Protocol):
    """Work in flight that `wait()` completes: a torch.distributed Work, or one of this module's
    composite operations (a pair swap, an all-reduce then slice)."""

    def wait(self) -> Any: ...


def started(work: dist.Work | None) -> dist.Work:
    """An async_op=True call's Work (torch types it Optional; it is None only without async_op)."""
    assert work is not None
    return work


def waiting(handle: GroupHandle | None, device: torch.device) -> AbstractContextManager[None]:
    """Time the block as a wait on the handle's group, in its context's wait clock."""
    monitor = handle.monitor if handle is not None else None
    return monitor.clock.waiting(device) if monitor is not None else nullcontext()


class Timed:
    """A torch.distributed Work whose wait is reported to the group's wait clock."""

    def __init__(self, work: dist.Work | None, device: torch.device, handle: GroupHandle) -> None:
        self.work, self.device, self.handle = started(work), device, handle

    def wait(self) -> None:
        with waiting(self.handle, self.device):
            self.work.wait()


def process_group(handle: GroupHandle) -> dist.ProcessGroup:
    """The handle's group; only a size-1 handle has none, and callers return before this."""
    assert handle.group is not None, "a size-1 group has no process group"
    return handle.group


@contextmanager
def count_collectives() -> Iterator[CollectiveCounts]:
    """Count the collectives issued inside the block, keyed by op name ("all_reduce", ...)."""
    counter = CollectiveCounts()
    active_counters.append(counter)
    try:
        yield counter
    finally:
        active_counters.remove(counter)


_RING_PASSES = {"all_reduce": 2, "all_gather": 1, "reduce_scatter": 1, "broadcast": 1}


def sent_bytes(op: str, full_bytes: float, size: int) -> float:
    """What one rank of a `size`-rank group sends in a call of collective `op` over a full
    tensor of `full_bytes`, under the ring model (the planner prices traffic with it too)."""
    return _RING_PASSES.get(op, 0) * full_bytes * (size - 1) / size


def traced() -> bool:
    """Inside a graph torch.compile is capturing (trainer.compile's blocks): the collectives
    below then issue PyTorch's functional collectives, which the graph holds and inductor
    schedules, and are neither counted nor timed (host code a graph would break on)."""
    return torch.compiler.is_compiling()


FUNCTIONAL_OPS = {dist.ReduceOp.SUM: "sum", dist.ReduceOp.MAX: "max"}


def record(
    op: str,
    handle: GroupHandle | None,
    x: Tensor | None = None,
    full_bytes: int = 0,
    *,
    monitor: CommMonitor | None = None,
) -> None:
    """One call of `op` on the handle's group (None: the world) over a full tensor of
    `full_bytes`: counted for `count_collectives`, kept in the hang report's recorder of
    the handle's context (or `monitor`'s, for a call on the world) and labelled in a profiler
    trace ("tpformer/all_reduce tp")."""
    if traced():
        return
    size = handle.size if handle is not None else 1
    monitor = monitor if monitor is not None else handle.monitor if handle is not None else None
    group = handle.group if handle is not None else None
    if monitor is not None:
        monitor.recorder.record(op, group, tuple(x.shape) if x is not None else ())
    if recording():
        mark(f"{op} {monitor.recorder.group_name(group)}" if monitor is not None else op)
    sent = sent_bytes(op, full_bytes, size)
    if op == "send" and x is not None:  # point to point: the whole tensor, once
        sent = float(x.nbytes)
    if not active_counters:
        return
    where = f"{op} {monitor.recorder.group_name(group) if monitor is not None else 'world'}"
    for counter in active_counters:
        counter[op] += 1
        counter.bytes[op] += sent
        counter.by_group[where] += 1
        counter.group_bytes[where] += sent
