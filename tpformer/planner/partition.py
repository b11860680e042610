"""Where the layers go: split points of a model over pipeline stages.

`best_split` is PipeDream's dynamic program: over contiguous runs of layers, minimize the time
of the slowest stage, where a stage costs its layers, plus the embedding on the first stage,
plus the output head on the last, plus the activation transfer into it (A(j, m) = the slowest
stage of the best pipeline of layers 1..j on m stages). `balanced` feeds it costs estimated
from FLOPs; `profile` feeds it times measured on this device (profile.py).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class StageCosts:
    """Per-layer forward+backward cost, the first stage's extra (embedding) and the last's
    (output head), and the cost of receiving one activation (0 on the first stage)."""

    layers: list[float]
    embedding: float = 0.0
    head: float = 0.0
    transfer: float = 0.0

    def stage_cost(self, start: int, stop: int) -> float:
        cost = sum(self.layers[start:stop])
        cost += self.embedding if start == 0 else self.transfer
        return cost + (self.head if stop == len(self.layers) else 0.0)

    def of_split(self, split: list[int]) -> list[float]:
        """The cost of each stage of `split` (layers per stage)."""
        bounds = [sum(split[:i]) for i in range(len(split) + 1)]
        return [self.stage_cost(a, b) for a, b in itertools.pairwise(bounds)]


def best_split(costs: StageCosts, stages: int) -> list[int]:
    """Layers per stage (each >= 1) minimizing the slowest stage; among splits with the same
    slowest stage, the most even one (so equal costs give the equal split).

    The dynamic program runs one stage count at a time over every (end, start) pair at once
    (numpy), so a 128-layer model on 64 stages takes milliseconds, not seconds (the planner
    splits every pipeline degree it prices)."""
    n = len(costs.layers)
    if not 1 <= stages <= n:
        raise ValueError(
            f"cannot split {n} layers over {stages} pipeline stages; "
            f"parallel.pipeline must be between 1 and {n}"
        )
    prefix = np.concatenate([[0.0], np.cumsum(np.asarray(costs.layers, dtype=np.float64))])
    end = np.arange(n + 1)[:, None]  # j: the stage ends before layer j
    start = np.arange(n + 1)[None, :]  # i: the stage starts at layer i
    cost = (
        prefix[end] - prefix[start]
        + np.where(start == 0, costs.embedding, costs.transfer)
        + np.where(end == n, costs.head, 0.0)
    )  # fmt: skip
    size = (end - start).astype(np.float64)
    # slowest[j], largest[j], smallest[j]: the best split of layers [0, j) on m stages: its
    # slowest stage (rounded as compared), its largest and smallest stage sizes
    slowest = np.full(n + 1, np.inf)
    slowest[0] = 0.0
    largest = np.full(n + 1, -np.inf)
    smallest = np.full(n + 1, np.inf)
    back = np.zeros((stages + 1, n + 1), dtype=np.int64)
    for m in range(1, stages + 1):
        valid = (start >= m - 1) & (start < end) & (end >= m) & np.isfinite(slowest)[None, :]
        worst = np.where(valid, np.round(np.maximum(slowest[None, :], cost), 9), np.inf)
        spread = np.maximum(largest[None, :], size) - np.minimum(smallest[None, :], size)
        best = worst.min(axis=1)
        choice = np.where(worst == best[:, None], spread, np.inf).argmin(axis=1)
        chosen_size = np.arange(n + 1) - choice
        largest = np.maximum(largest[choice], chosen_size)
        smallest = np.minimum(smallest[choice], chosen_size)
        slowest = best
        back[m] = choice
    split, j = [], n
    for m in range(stages, 0, -1):
        i = int(back[m, j])
        split.append(j - i)
        j = i
    return split[::-1]


def equal_split(layers: int, parts: int) -> list[int]:
    """layers / parts each (the interleaved schedule's chunks must be equal)."""
    if layers % parts:
        raise ValueError(f"{layers} layers do not split evenly into {parts} pipeline chunks")
    return [layers // parts] * parts


@dataclass(frozen=True)
class ReplicatedStage:
    """PipeDream's stage: a run of `layers` layers on `replicas` workers (data parallel)."""

    layers: int
    replicas: int


def replication_string(stages: list[ReplicatedStage]) -> str:
    """PipeDream's name of a configuration: replicas per stage, e.g. "2-1-1"."""
    return "-".join(str(s.replicas) for s in stages)


def replicated_stage_time(
    compute: float, weight_bytes: float, replicas: int, allreduce_bytes_per_s: float
) -> float:
    """PipeDream's time per micro-batch of a stage on `replicas` workers: max(compute, the
    all-reduce of its weights, 2 (m - 1) / m x bytes / bandwidth) / m."""
    sync = 2 * (replicas - 1) / replicas * weight_bytes / allreduce_bytes_per_s
    return max(compute, sync) / replicas


_Option = tuple[float, tuple[ReplicatedStage, ...]]


def _check_partition_sizes(layers: int, workers: int, stages: int | None) -> None:
    if workers < 1:
        raise ValueError(f"pipedream partition needs at least one worker (got {workers})")
    if stages is not None and not 1 <= stages <= min(layers, workers):
        raise ValueError(
            f"cannot place {stages} pipeline stages on {layers} layers and {workers} workers; "
            f"parallel.pipeline must be between 1 and {min(layers, workers)}"
        )


def _best_pipelines(
    n: int,
    workers: int,
    most_stages: int,
    stage_time: Callable[[int, int, int], float],
    allowed: Callable[[int], bool],
) -> dict[tuple[int, int, int], _Option]:
    """best[(j, m, s)]: the (slowest stage, stages) of the best pipeline of layers [0, j) on
    m workers in s stages (ties: fewer stages)."""
    best: dict[tuple[int, int, int], _Option] = {}
    counts = range(1, most_stages + 1)

    def keep(key: tuple[int, int, int], option: _Option) -> None:
        if key not in best or (round(option[0], 12), len(option[1])) < (
            round(best[key][0], 12),
            len(best[key][1]),
        ):
            best[key] = option

    for j in range(1, n + 1):
        for m in range(1, workers + 1):
            if allowed(m):
                keep((j, m, 1), (stage_time(0, j, m), (ReplicatedStage(j, m),)))
            for i in range(1, j):
                for last in filter(allowed, range(1, m)):
                    for s in counts[1:]:
                        before = best.get((i, m - last, s - 1))
                        if before is not None:
                            slowest = max(before[0], stage_time(i, j, last))
                            keep((j, m, s), (slowest, (*before[1], ReplicatedStage(j - i, last))))
    return best


def pipedream_partition(
    costs: StageCosts,
    weight_bytes: list[float],
    workers: int,
    allreduce_bytes_per_s: float,
    *,
    stages: int | None = None,
    divides: int | None = None,
) -> tuple[list[ReplicatedStage], float]:
    """PipeDream's dynamic program over (split, replicas per stage) on `workers` workers, and
    the time per micro-batch of its slowest stage.

    A stage of layers [i, j) on m replicas takes T(i, j, m) = `replicated_stage_time`, compute as
    `StageCosts.stage_cost` (embedding, head, the transfer into it), the weights `weight_bytes`
    per layer (the embedding's and head's in the first and last entries' share); A(j, m) = the
    slowest stage of the best pipeline of layers [0, j) on m workers
    = min(T(0, j, m), min over i < j, m' < m of max(A(i, m - m'), T(i, j, m'))), the transfer
    being part of the stage that receives it. Every worker is used. `stages`: exactly that many
    stages (parallel.pipeline); `divides`: only replica counts that divide it (the micro-batches
    of a step, which a stage's replicas take in turn)."""
    n = len(costs.layers)
    _check_partition_sizes(n, workers, stages)
    prefix = np.concatenate([[0.0], np.cumsum(np.asarray(weight_bytes, dtype=np.float64))])

    def stage_time(i: int, j: int, m: int) -> float:
        compute, weights = costs.stage_cost(i, j), prefix[j] - prefix[i]
        return replicated_stage_time(compute, weights, m, allreduce_bytes_per_s)

    def allowed(m: int) -> bool:
        return divides is None or divides % m == 0

    best = _best_pipelines(n, workers, stages or n, stage_time, allowed)
    counts = range(1, (stages or n) + 1)
    options = [
        best[(n, workers, s)] for s in ([stages] if stages else counts) if (n, workers, s) in best
    ]
    if not options:
        raise ValueError(
            f"no PipeDream configuration of {workers} workers in {stages} stages has replica "
            f"counts that divide the {divides} micro-batches of a step; change "
            "trainer.grad_accum or the world size"
        )
    slowest, chosen = min(options, key=lambda o: (round(o[0], 12), len(o[1])))
    return list(chosen), slowest
