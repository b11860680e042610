"""How long this rank waited for its peers: the time blocked in collectives and point-to-point
receives, so that step time minus it is the rank's own work and a straggler stands out (in a
synchronous step every rank's wall time is the same: the slow rank's peers wait for it).

On the CPU a wait blocks the host, so it is host time. On CUDA, NCCL does not block the host; what
waits is the compute stream, so each wait is a pair of timing events on it, read when the loop
logs (it has synchronized the device for its values then): nothing here waits for the device."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

import torch


class WaitClock:
    """Seconds waited since the last `take()`; nested waits count once."""

    def __init__(self) -> None:
        self._host = 0.0
        self._events: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []
        self._depth = 0

    @contextmanager
    def waiting(self, device: torch.device) -> Iterator[None]:
        """Time the block as a wait of the compute stream of `device` (the host on the CPU)."""
        if self._depth:
            yield
            return
        self._depth += 1
        try:
            if device.type == "cuda":
                start = torch.cuda.Event(enable_timing=True)
                start.record()
                yield
                end = torch.cuda.Event(enable_timing=True)
                end.record()
                self._events.append((start, end))
            else:
                begin = time.perf_counter()
                yield
                self._host += time.perf_counter() - begin
        finally:
            self._depth -= 1

    def take(self) -> float:
        """The seconds waited since the last call, and start counting anew. CUDA: call once the
        device has run past the waits (the loop reads its values first)."""
        for _, end in self._events:
            end.synchronize()  # already complete where the loop has read its values
        seconds = self._host + sum(s.elapsed_time(e) for s, e in self._events) / 1e3
        self._host, self._events = 0.0, []
        return seconds
