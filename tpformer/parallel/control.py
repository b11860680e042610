"""Host-side agreements between ranks, over the gloo control group (ParallelContext.control).

The training loop asks every step whether any rank wants to stop (SIGTERM, the time limit, a
failed background save). On an accelerator, all-reducing a flag over the compute (NCCL) group
and reading it would wait for everything queued before it; over gloo the flags go host to host
and the device keeps running. `StopAgreement` also keeps the hosts from waiting for each other at
every step: it agrees one step late (see there).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from tpformer.parallel.context import ParallelContext


def agree_any(ctx: ParallelContext, *flags: bool) -> list[bool]:
    """Each flag true on every rank as soon as it is true on any, so all ranks stop at the same
    step; a host tensor on the gloo control group, never a device value."""
    if ctx.control.size == 1:
        return list(flags)
    t = torch.tensor([float(f) for f in flags])
    ctx.monitor.recorder.record("all_reduce", ctx.control.group, tuple(t.shape))  # not counted
    with ctx.monitor.clock.waiting(ctx.device):  # on CUDA the compute stream does not wait: ~0
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=ctx.control.group)
    return [bool(x) for x in t.tolist()]


class StopAgreement:
    """The loop's stop flags, agreed one step late: each step posts its flags in an asynchronous
    all-reduce over the control group and reads the previous step's result. A host then waits
    only for a peer that has not posted the previous step's flags by the end of this step, not
    for the slowest host at every step (gloo's latency grows with the world). Every rank reads
    the same result at the same step, so all stop together: a SIGTERM, the time limit or a
    failed save raised during step k stops the run after step k + 1. One process: the flags as
    they are, at once."""

    def __init__(self, ctx: ParallelContext) -> None:
        self.ctx = ctx
        self._pending: tuple[torch.Tensor, Any] | None = None

    def exchange(self, *flags: bool) -> list[bool]:
        """Post this step's flags; the agreed flags of the previous step (all false at the
        first)."""
        if self.ctx.control.size == 1:
            return list(flags)
        agreed = self.settle() or [False] * len(flags)
        posted = torch.tensor([float(f) for f in flags])
        group = self.ctx.control.group
        self.ctx.monitor.recorder.record("all_reduce", group, tuple(posted.shape))  # not counted
        work = dist.all_reduce(posted, op=dist.ReduceOp.MAX, group=group, async_op=True)
        self._pending = (posted, work)
        return agreed

    def settle(self) -> list[bool] | None:
        """Wait for the flags in flight, if any (the loop's end calls it: no collective may
        outlive the loop), and return them agreed."""
        if self._pending is None:
            return None
        posted, work = self._pending
        self._pending = None
        with self.ctx.monitor.clock.waiting(self.ctx.device):
            work.wait()
        return [bool(x) for x in posted.tolist()]
