"""The ranks of a torchrun job that does not train (a sharded preprocessing): a gloo group on
the CPU, used only for barriers."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

import torch.distributed as dist

from tpformer.parallel.env import LaunchEnv


def host_ranks(timeout: timedelta) -> tuple[int, int, Callable[[], None]]:
    """(rank, world size, barrier) of this torchrun job; (0, 1, no-op) outside torchrun. The
    barrier waits up to `timeout` for the slowest rank."""
    if LaunchEnv.read().world_size == 1:
        return 0, 1, lambda: None
    dist.init_process_group("gloo", timeout=timeout)
    return dist.get_rank(), dist.get_world_size(), dist.barrier
