"""Point-to-point transfers: a pipeline stage's sends and receives, and ring attention's ring."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor

from tpformer.parallel.comm.record import (
    Pending,
    Timed,
    process_group,
    record,
    waiting,
)
from tpformer.parallel.handle import GroupHandle


def send_async(x: Tensor, peer: int, handle: GroupHandle, tag: int) -> Pending:
    """Point-to-point send of x to group rank `peer` (a pipeline neighbour); keep x alive until
    the returned work is waited on. `tag` tells gloo's messages apart; NCCL matches by order."""
    record("send", handle, x)
    group = process_group(handle)
    work = dist.isend(x.contiguous(), dst=dist.get_global_rank(group, peer), group=group, tag=tag)
    return Timed(work, x.device, handle)


def recv(out: Tensor, peer: int, handle: GroupHandle, tag: int) -> Tensor:
    """Receive into `out` from group rank `peer`, waiting (up to the group's timeout)."""
    record("recv", handle, out)
    group = process_group(handle)
    work = dist.irecv(out, src=dist.get_global_rank(group, peer), group=group, tag=tag)
    Timed(work, out.device, handle).wait()
    return out


class _RingStep:
    """A send to the next ring rank and a receive from the previous one, in flight."""

    def __init__(
        self, works: list[dist.Work], out: Tensor, sent: Tensor, handle: GroupHandle
    ) -> None:
        self.works, self.out, self.sent = works, out, sent  # `sent` kept alive until done
        self.handle = handle

    def wait(self) -> Tensor:
        with waiting(self.handle, self.out.device):
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
    record("send", handle, x)
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
    return _RingStep(dist.batch_isend_irecv(ops), out, x, handle)
