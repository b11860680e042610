"""GroupHandle: a frozen (group, rank, size) view of one process group, the record layers,
the engine and checkpoints take instead of a raw torch.distributed group."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch.distributed as dist

from tpformer.parallel.monitor import CommMonitor


@dataclass(frozen=True)
class GroupHandle:
    """A frozen (group, rank, size) view of one mesh dimension; group is None when size == 1.

    `gloo_shortcuts`: on gloo, comm may take CPU-only shortcuts for this group (two-rank swaps,
    reduce-scatter as all-reduce + slice); False keeps the generic path NCCL takes."""

    group: dist.ProcessGroup | None
    rank: int
    size: int
    gloo_shortcuts: bool = True
    monitor: CommMonitor | None = field(default=None, compare=False, repr=False)
    """Where the collectives on this group report (their context's; None: nowhere)."""

    def __post_init__(self) -> None:
        if self.size < 1 or not 0 <= self.rank < self.size:
            raise ValueError(f"invalid group handle: rank={self.rank}, size={self.size}")
        if self.group is None:
            if self.size != 1:
                raise ValueError(f"a group of size {self.size} needs a process group, got None")
            return
        actual = dist.get_world_size(self.group)
        if actual != self.size:
            raise ValueError(
                f"process group has {actual} ranks but the handle says size={self.size}; "
                "pass the group that matches the layout (ctx.tp or ctx.dp)"
            )

    @staticmethod
    def single() -> GroupHandle:
        return GroupHandle(group=None, rank=0, size=1)
