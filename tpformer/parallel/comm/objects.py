"""Picklable objects across ranks (layouts, counts, plans): host-side, never inside a step."""

from __future__ import annotations

from typing import Any, TypeVar

import torch.distributed as dist

from tpformer.parallel.comm.record import record
from tpformer.parallel.handle import GroupHandle
from tpformer.parallel.monitor import CommMonitor

T = TypeVar("T")


def broadcast_object(obj: object, *, src: int = 0, monitor: CommMonitor | None = None) -> object:
    """Global rank `src`'s picklable object on every rank (a no-op without torch.distributed);
    recorded in `monitor` (the caller's context's) for the hang report."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return obj
    record("broadcast", None, monitor=monitor)
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def all_gather_object(obj: T, handle: GroupHandle) -> list[T]:
    """Every rank's picklable object of the group, in group-rank order."""
    if handle.size == 1:
        return [obj]
    record("all_gather_object", handle)
    out: list[Any] = [None] * handle.size
    dist.all_gather_object(out, obj, group=handle.group)
    return out


def distributed() -> bool:
    """Whether torch.distributed is initialized (a one-process run is not)."""
    return dist.is_initialized()


def world_rank() -> int:
    """This process's global rank (0 without torch.distributed)."""
    return dist.get_rank() if dist.is_initialized() else 0


def barrier(group: dist.ProcessGroup | None = None, *, monitor: CommMonitor | None = None) -> None:
    """Every rank of `group` (default: the world) reaches this line; a no-op in one process."""
    if dist.is_initialized():
        record("barrier", None, monitor=monitor)
        dist.barrier(group=group)


def objects_of(
    value: object,
    group: dist.ProcessGroup | None = None,
    *,
    monitor: CommMonitor | None = None,
) -> list[object]:
    """Every rank's picklable `value` over a raw process group (default: the world), in rank
    order; [value] in one process. For callers that hold a group rather than a handle (the
    checkpoint writer's own gloo group)."""
    if not dist.is_initialized():
        return [value]
    record("all_gather_object", None, monitor=monitor)
    values: list[object] = [None] * dist.get_world_size(group)
    dist.all_gather_object(values, value, group=group)
    return values
