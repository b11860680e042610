"""What a context's collectives report to: the hang report's recorder of the last calls and the
wait clock of the time spent waiting for peers. One per ParallelContext, carried by each of its
group handles, so two contexts in one process (tests, a regrouped PipeDream run) keep apart."""

from __future__ import annotations

from dataclasses import dataclass, field

from tpformer.parallel.hang_report import FlightRecorder
from tpformer.parallel.wait_clock import WaitClock


@dataclass
class CommMonitor:
    recorder: FlightRecorder = field(default_factory=FlightRecorder)
    clock: WaitClock = field(default_factory=WaitClock)
