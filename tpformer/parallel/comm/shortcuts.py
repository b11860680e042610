"""gloo's CPU-only shortcuts (parallel.gloo_shortcuts): two-rank swaps point to point instead of
gloo's ring collectives, and reduce-scatter as all-reduce plus a slice. NCCL never takes them."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import Tensor

from tpformer.parallel.comm.record import started, waiting
from tpformer.parallel.handle import GroupHandle


class AllReduceThenSlice:
    """A reduce-scatter done as an in-place all-reduce plus a copy of this rank's chunk.

    gloo's reduce-scatter is about 2x slower than its all-reduce on the same buffer (measured
    on CPU, 32 MB, 2 ranks: 52 ms vs 27 ms), so on gloo this is the faster way to the same sums.
    """

    def __init__(self, work: dist.Work, out: Tensor, x: Tensor, handle: GroupHandle) -> None:
        self.work, self.out, self.x, self.handle = work, out, x, handle
        self.rank = handle.rank

    def wait(self) -> None:
        with waiting(self.handle, self.out.device):
            self.work.wait()
        n = self.out.numel()
        self.out.copy_(self.x[self.rank * n : (self.rank + 1) * n])


class PairExchange:
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
            started(dist.isend(send, group=handle.group, group_dst=peer)),
            started(dist.irecv(recv, group=handle.group, group_src=peer)),
        ]
        self.finish, self.device, self.handle = finish, recv.device, handle

    def wait(self) -> None:
        with waiting(self.handle, self.device):
            for work in self.works:
                work.wait()
        if self.finish is not None:
            self.finish()


def gloo_shortcuts(handle: GroupHandle) -> bool:
    """Whether this group may take the CPU-only shortcuts below (parallel.gloo_shortcuts, on a
    gloo group); without them every collective takes the generic path NCCL takes."""
    return handle.gloo_shortcuts and dist.get_backend(handle.group) == "gloo"


def pairwise(handle: GroupHandle) -> bool:
    """gloo with two ranks: a swap of halves moves half the bytes of gloo's ring collectives
    and runs on gloo's transport without its collective algorithms (measured on CPU, 32 MB,
    2 ranks: exchange 17.7 ms vs all-reduce 29.6 ms and all_gather_into_tensor 44.0 ms)."""
    return handle.size == 2 and gloo_shortcuts(handle)


PAIR_SWAP_MAX_BYTES = 8 << 20
"""gloo with two ranks: up to this size a SUM all-reduce is one swap of the whole tensor (each
rank adds the other's; a + b == b + a, so both get the same bits), one round trip instead of
gloo's ring. Measured on the 2-core CPU machine, each after a 1.6 ms matmul as in a layer:
1.5 MB 3.3 ms vs 5.2 ms, 8 MB 8.2 vs 9.3 ms; from 16 MB the ring wins (20.8 vs 13.4 ms)."""


def swaps(x: Tensor, handle: GroupHandle) -> bool:
    return pairwise(handle) and x.nbytes <= PAIR_SWAP_MAX_BYTES


def swap_sum(x: Tensor, handle: GroupHandle) -> PairExchange:
    """Start x += the peer's x (see PAIR_SWAP_MAX_BYTES); `wait()` completes it."""
    theirs = torch.empty_like(x)
    return PairExchange(x, theirs, handle, finish=lambda: x.add_(theirs))
