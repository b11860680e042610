"""A schedule replayed: every stage's action list (parallel/pipeline/schedule.py) run under the
runner's rules (blocking receives, non-blocking sends, a replicated stage's joint updates), to
prove a schedule cannot deadlock and to measure its makespan, bubble and peak in-flight
micro-batches. The planner and the startup report price pipelines with it."""

from __future__ import annotations

from dataclasses import dataclass

from tpformer.parallel.pipeline.schedule import (
    Action,
    actions_for,
    pipedream_drain,
    pipedream_step,
    replica_backwards_per_update,
    virtual_stage,
)


@dataclass
class Simulation:
    """What `simulate` found: the makespan, each stage's busy time, its peak in-flight
    micro-batches (forwards whose backward has not run: their activations are alive) and each
    stage's timeline of (action, start, end)."""

    makespan: float
    busy: list[float]
    peak_in_flight: list[int]
    timeline: list[list[tuple[Action, float, float]]]

    @property
    def bubble(self) -> float:
        """Idle share of the pipeline: 1 - busy area / total area."""
        return 1.0 - sum(self.busy) / (self.makespan * len(self.busy))

    def span(self, stage: int, first: Action, last: Action) -> float:
        """Time from the start of `stage`'s action `first` to the end of its `last`."""
        times = {a: (start, end) for a, start, end in self.timeline[stage]}
        return times[last][1] - times[first][0]

    def idle_between(self, stage: int, first: Action, last: Action) -> float:
        """Time `stage` waits between the start of action `first` and the end of `last`."""
        times = {a: (start, end) for a, start, end in self.timeline[stage]}
        begin, end = times[first][0], times[last][1]
        busy = sum(e - s for _, s, e in self.timeline[stage] if s >= begin and e <= end)
        return end - begin - busy


def stage_lists(
    name: str,
    stages: int,
    micro: int,
    chunks: int = 1,
    steps: int = 1,
    replicas: tuple[int, ...] = (),
    every_step: bool = False,
) -> list[list[Action]]:
    """Every stage's actions for `steps` steps (pipedream: the stream of `steps` steps, then
    the drain; the other schedules flush every step, so one step says it all). With replicated
    stages (pipedream only), one list per worker, stage by stage, with the replicas' joint
    updates as "U" actions (micro = the update's number)."""
    if name == "pipedream":
        lists = []
        for r in range(stages):
            for j in range(replicas[r] if replicas else 1):
                actions = [
                    a
                    for t in range(steps)
                    for a in pipedream_step(stages, micro, r, t, replicas, j)
                ]
                actions += pipedream_drain(stages, micro, r, steps, replicas, j)
                lists.append(_with_updates(actions, micro, r, replicas, every_step))
        return lists
    return [actions_for(name, stages, micro, r, chunks) for r in range(stages)]


def _with_updates(
    actions: list[Action], micro: int, stage: int, replicas: tuple[int, ...], every_step: bool
) -> list[Action]:
    """A replicated stage's list with its updates (a collective of its replicas) marked."""
    if not replicas:
        return actions
    n = replicas[stage]
    every = replica_backwards_per_update(micro, n, every_step=every_step)
    out: list[Action] = []
    for a in actions:
        out.append(a)
        if a.kind == "B" and (a.micro // n + 1) % every == 0:
            out.append(Action("U", (a.micro // n) // every))
    return out


def simulate(
    name: str,
    stages: int,
    micro: int,
    chunks: int = 1,
    *,
    steps: int = 1,
    forward_time: list[float] | None = None,
    backward_ratio: float = 2.0,
    transfer: float = 0.0,
    replicas: tuple[int, ...] = (),
    every_step: bool = False,
) -> Simulation:
    """Run every worker's list under the runner's rules (a forward waits for the previous
    virtual stage's forward, a backward for the next one's backward, an update of replicated
    stage for all its replicas; sends never block) with per-virtual-stage forward times
    (default 1) and backward = ratio x forward. One worker per stage unless `replicas`
    (pipedream). Raises RuntimeError if the lists deadlock."""
    lists = stage_lists(name, stages, micro, chunks, steps, replicas, every_step)
    stage_of = [r for r in range(stages) for _ in range(replicas[r] if replicas else 1)]
    sim = _Workers(lists, stage_of, stages, chunks, forward_time or [1.0] * (stages * chunks))
    while any(sim.position[w] < len(lists[w]) for w in range(len(lists))):
        progressed = False
        for w in range(len(lists)):
            if sim.position[w] < len(lists[w]):
                progressed |= sim.advance(w, backward_ratio, transfer)
        if not progressed:
            raise RuntimeError(f"{name} deadlocks at positions {sim.position}")
    return Simulation(max(sim.clock), sim.busy, sim.peak, sim.timeline)


class _Workers:
    """The simulated workers: each one's clock, busy time, place in its list, live activations
    (and their peak), timeline; and when each (kind, micro-batch, virtual stage) finished."""

    def __init__(
        self,
        lists: list[list[Action]],
        stage_of: list[int],
        stages: int,
        chunks: int,
        fwd: list[float],
    ) -> None:
        workers = len(lists)
        self.lists, self.stage_of, self.stages, self.fwd = lists, stage_of, stages, fwd
        self.last = stages * chunks - 1
        self.done: dict[tuple[str, int, int], float] = {}
        self.clock, self.busy = [0.0] * workers, [0.0] * workers
        self.position, self.alive, self.peak = [0] * workers, [0] * workers, [0] * workers
        self.timeline: list[list[tuple[Action, float, float]]] = [[] for _ in range(workers)]

    def advance(self, w: int, backward_ratio: float, transfer: float) -> bool:
        """Run worker w's next action if what it waits for is done; whether it ran."""
        a = self.lists[w][self.position[w]]
        r = self.stage_of[w]
        if a.kind == "U":
            return self._update(a, r)
        v = virtual_stage(a.chunk, r, self.stages)
        if a.kind == "F":
            needs = ("F", a.micro, v - 1) if v > 0 else None
        else:
            needs = ("B", a.micro, v + 1) if v < self.last else ("F", a.micro, v)
        if needs is not None and needs not in self.done:
            return False
        ready = self.done[needs] + (transfer if needs[2] != v else 0.0) if needs else 0.0
        cost = self.fwd[v] * (1.0 if a.kind == "F" else backward_ratio)
        start = max(self.clock[w], ready)
        self.clock[w] = start + cost
        self.timeline[w].append((a, start, self.clock[w]))
        self.busy[w] += cost
        self.done[(a.kind, a.micro, v)] = self.clock[w]
        self.alive[w] += 1 if a.kind == "F" else -1
        self.peak[w] = max(self.peak[w], self.alive[w])
        self.position[w] += 1
        return True

    def _update(self, a: Action, r: int) -> bool:
        """A replicated stage's update: once every replica of stage r has reached it."""
        group = [u for u in range(len(self.lists)) if self.stage_of[u] == r]
        if any(
            self.position[u] == len(self.lists[u]) or self.lists[u][self.position[u]] != a
            for u in group
        ):
            return False
        start = max(self.clock[u] for u in group)
        for u in group:
            self.clock[u] = start
            self.position[u] += 1
        return True
