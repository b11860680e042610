"""Host-side agreements between ranks, over the gloo control group (ParallelContext.control).

The training loop asks every step whether any rank wants to stop (SIGTERM, the time limit). On
an accelerator, all-reducing a flag over the compute (NCCL) group and reading it would wait for
everything queued before it; over gloo the flags go host to host and the device keeps running.
"""

from __future__ import annotations

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
