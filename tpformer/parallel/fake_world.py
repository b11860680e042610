"""A process group for a world that does not exist: torch.distributed's `fake` backend, on which
every collective completes at once, for this process as any rank of any world size. Dry runs
(train/dry_run.py) build a rank's real ParallelContext on it."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch.distributed as dist


@contextmanager
def fake_world(rank: int, world_size: int) -> Iterator[None]:
    """The default process group, on the fake backend, for the block."""
    import torch.testing._internal.distributed.fake_pg as fake_pg  # registers the backend

    # named for the meta device too: batched point-to-point (ring attention) looks the
    # backend up by the tensors' device
    backends = "cpu:fake,cuda:fake,meta:fake"
    dist.init_process_group(backends, rank=rank, world_size=world_size, store=fake_pg.FakeStore())
    try:
        yield
    finally:
        dist.destroy_process_group()
