"""Where the layers go: split points of a model over pipeline stages.

`best_split` is PipeDream's dynamic program: over contiguous runs of layers, minimize the time
of the slowest stage, where a stage costs its layers, plus the embedding on the first stage,
plus the output head on the last, plus the activation transfer into it (A(j, m) = the slowest
stage of the best pipeline of layers 1..j on m stages). `balanced` feeds it costs estimated
from FLOPs; `profile` feeds it times measured on this device (profile.py).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass


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
    slowest stage, the most even one (so equal costs give the equal split)."""
    n = len(costs.layers)
    if not 1 <= stages <= n:
        raise ValueError(
            f"cannot split {n} layers over {stages} pipeline stages; "
            f"parallel.pipeline must be between 1 and {n}"
        )
    inf = float("inf")
    # best[m][j]: (slowest stage, split) of layers [0, j) on m stages
    best: list[list[tuple[float, list[int]]]] = [[(inf, [])] * (n + 1) for _ in range(stages + 1)]
    best[0][0] = (0.0, [])
    for m in range(1, stages + 1):
        for j in range(m, n + 1):
            options = []
            for i in range(m - 1, j):
                prev, split = best[m - 1][i]
                if prev == inf:
                    continue
                slowest = max(prev, costs.stage_cost(i, j))
                # prefer the split whose stage sizes are most even among equal slowest stages
                options.append(
                    (
                        round(slowest, 9),
                        max([*split, j - i]) - min([*split, j - i]),
                        [*split, j - i],
                    )
                )
            if options:
                slowest, _, split = min(options, key=lambda o: (o[0], o[1]))
                best[m][j] = (slowest, split)
    return best[stages][n][1]


def equal_split(layers: int, parts: int) -> list[int]:
    """layers / parts each (the interleaved schedule's chunks must be equal)."""
    if layers % parts:
        raise ValueError(f"{layers} layers do not split evenly into {parts} pipeline chunks")
    return [layers // parts] * parts


def check_split(split: list[int], layers: int, parts: int, what: str) -> list[int]:
    """An explicit list: one positive count per stage (or virtual stage), summing to layers."""
    if len(split) != parts:
        raise ValueError(
            f"parallel.pipeline_split={split} has {len(split)} entries; {what} "
            f"needs {parts} (one per stage)"
        )
    if any(int(n) != n or n < 1 for n in split):
        raise ValueError(f"parallel.pipeline_split={split}: every stage needs at least one layer")
    if sum(split) != layers:
        raise ValueError(
            f"parallel.pipeline_split={split} sums to {sum(split)} layers; the model "
            f"has model.num_layers={layers}"
        )
    return [int(n) for n in split]
