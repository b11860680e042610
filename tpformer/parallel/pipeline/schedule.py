"""Pipeline schedules as plain data: per stage, the ordered forward/backward actions of one step.

A schedule is a pure function of (stages p, micro-batches m[, virtual stages v]); the runner
executes a stage's list with blocking receives and non-blocking sends, and `simulate` replays
all lists under the same rules to prove a schedule cannot deadlock and to compute its bubble.

gpipe             all forwards, then all backwards (AFAB): activations of all m micro-batches
                  are alive at once.
1f1b              p - r - 1 warm-up forwards on stage r, then one forward / one backward, then
                  the remaining backwards: at most p - r micro-batches alive (PipeDream-Flush).
interleaved_1f1b  each stage holds v model chunks (virtual stage c x p + r); micro-batches go
                  through in groups of p, chunk by chunk (Megatron's order): the bubble shrinks
                  by v at the price of v x more activation messages.
"""

from __future__ import annotations

from dataclasses import dataclass

SCHEDULES = ("gpipe", "1f1b", "interleaved_1f1b")


@dataclass(frozen=True)
class Action:
    """Forward ("F") or backward ("B") of micro-batch `micro` through this stage's `chunk`."""

    kind: str
    micro: int
    chunk: int = 0

    def __repr__(self) -> str:
        return f"{self.kind}{self.micro}" + (f".{self.chunk}" if self.chunk else "")


def virtual_stage(chunk: int, stage: int, stages: int) -> int:
    """Position in the model of a stage's chunk: chunk c of stage r runs virtual stage c*p + r."""
    return chunk * stages + stage


def gpipe(stages: int, micro: int, stage: int) -> list[Action]:
    return [Action("F", i) for i in range(micro)] + [Action("B", i) for i in range(micro)]


def one_f_one_b(stages: int, micro: int, stage: int) -> list[Action]:
    warmup = min(stages - stage - 1, micro)
    actions = [Action("F", i) for i in range(warmup)]
    for i in range(micro - warmup):
        actions += [Action("F", warmup + i), Action("B", i)]
    return actions + [Action("B", i) for i in range(micro - warmup, micro)]


def interleaved(stages: int, micro: int, stage: int, chunks: int) -> list[Action]:
    """Megatron's interleaved 1F1B; needs micro a multiple of stages."""
    if micro % stages:
        raise ValueError(
            f"interleaved_1f1b needs the micro-batches per step ({micro}) to be a "
            f"multiple of parallel.pipeline={stages}"
        )
    total = micro * chunks

    def unit(k: int, backward: bool) -> Action:
        in_group = k % (stages * chunks)
        chunk = in_group // stages
        mb = (k // (stages * chunks)) * stages + k % stages
        return Action("B" if backward else "F", mb, chunks - 1 - chunk if backward else chunk)

    warmup = min((stages - stage - 1) * 2 + (chunks - 1) * stages, total)
    actions = [unit(k, False) for k in range(warmup)]
    for k in range(total - warmup):
        actions += [unit(warmup + k, False), unit(k, True)]
    return actions + [unit(k, True) for k in range(total - warmup, total)]


def actions_for(
    name: str, stages: int, micro: int, stage: int, chunks: int = 1, *, train: bool = True
) -> list[Action]:
    """Stage `stage`'s actions for one step; forward-only (evaluation) keeps the forwards."""
    if name == "gpipe":
        actions = gpipe(stages, micro, stage)
    elif name == "1f1b":
        actions = one_f_one_b(stages, micro, stage)
    elif name == "interleaved_1f1b":
        actions = interleaved(stages, micro, stage, chunks)
    else:
        raise ValueError(f"unknown pipeline schedule {name!r}; valid: {list(SCHEDULES)}")
    return actions if train else [a for a in actions if a.kind == "F"]


@dataclass
class Simulation:
    """What `simulate` found: the makespan, each stage's busy time and its peak in-flight
    micro-batches (forwards whose backward has not run: their activations are alive)."""

    makespan: float
    busy: list[float]
    peak_in_flight: list[int]

    @property
    def bubble(self) -> float:
        """Idle share of the pipeline: 1 - busy area / total area."""
        return 1.0 - sum(self.busy) / (self.makespan * len(self.busy))


def simulate(
    name: str,
    stages: int,
    micro: int,
    chunks: int = 1,
    *,
    forward_time: list[float] | None = None,
    backward_ratio: float = 2.0,
    transfer: float = 0.0,
) -> Simulation:
    """Run every stage's list under the runner's rules (a forward waits for the previous
    virtual stage's forward, a backward for the next one's backward; sends never block) with
    per-virtual-stage forward times (default 1) and backward = ratio x forward. Raises
    RuntimeError if the lists deadlock."""
    lists = [actions_for(name, stages, micro, r, chunks) for r in range(stages)]
    last = stages * chunks - 1
    fwd = forward_time or [1.0] * (stages * chunks)
    done: dict[tuple[str, int, int], float] = {}
    clock, busy = [0.0] * stages, [0.0] * stages
    position, alive, peak = [0] * stages, [0] * stages, [0] * stages
    while any(position[r] < len(lists[r]) for r in range(stages)):
        progressed = False
        for r in range(stages):
            if position[r] == len(lists[r]):
                continue
            a = lists[r][position[r]]
            v = virtual_stage(a.chunk, r, stages)
            if a.kind == "F":
                needs = ("F", a.micro, v - 1) if v > 0 else None
            else:
                needs = ("B", a.micro, v + 1) if v < last else ("F", a.micro, v)
            if needs is not None and needs not in done:
                continue
            ready = done[needs] + (transfer if needs[2] != v else 0.0) if needs else 0.0
            cost = fwd[v] * (1.0 if a.kind == "F" else backward_ratio)
            clock[r] = max(clock[r], ready) + cost
            busy[r] += cost
            done[(a.kind, a.micro, v)] = clock[r]
            alive[r] += 1 if a.kind == "F" else -1
            peak[r] = max(peak[r], alive[r])
            position[r] += 1
            progressed = True
        if not progressed:
            raise RuntimeError(f"{name} deadlocks at positions {position}")
    return Simulation(max(clock), busy, peak)
