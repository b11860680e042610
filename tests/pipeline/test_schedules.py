"""Schedules and the partitioner as plain data: no processes."""

import itertools
import random

import pytest

from tpformer.parallel.layout import check_split
from tpformer.parallel.pipeline.schedule import actions_for
from tpformer.parallel.pipeline.simulate import simulate
from tpformer.planner.partition import StageCosts, best_split

SCHEDULES = [("gpipe", 1), ("1f1b", 1), ("interleaved_1f1b", 2), ("interleaved_1f1b", 3)]


@pytest.mark.parametrize(("name", "chunks"), SCHEDULES)
@pytest.mark.parametrize("stages", [1, 2, 3, 4])
@pytest.mark.parametrize("micro", [1, 2, 4, 8])
def test_every_schedule_runs_each_micro_batch_once_and_never_deadlocks(
    name: str, chunks: int, stages: int, micro: int
) -> None:
    if name == "interleaved_1f1b" and micro % stages:
        with pytest.raises(ValueError, match=f"multiple of parallel.pipeline={stages}"):
            actions_for(name, stages, micro, 0, chunks)
        return
    for r in range(stages):
        actions = actions_for(name, stages, micro, r, chunks)
        for kind in "FB":
            done = sorted((a.micro, a.chunk) for a in actions if a.kind == kind)
            assert done == sorted(itertools.product(range(micro), range(chunks)))
        position = {(a.kind, a.micro, a.chunk): i for i, a in enumerate(actions)}
        assert all(
            position[("F", m, c)] < position[("B", m, c)]
            for m in range(micro)
            for c in range(chunks)
        )
        # gradients accumulate in micro-batch order within each chunk (as the 1-process run)
        for c in range(chunks):
            order = [a.micro for a in actions if a.kind == "B" and a.chunk == c]
            assert order == sorted(order)
    sim = simulate(name, stages, micro, chunks)  # raises on a deadlock
    assert len(sim.busy) == stages


@pytest.mark.parametrize("stages", [2, 4])
@pytest.mark.parametrize("micro", [1, 2, 4, 8])
def test_bubble_and_memory_follow_the_theory(stages: int, micro: int) -> None:
    """Equal stages: GPipe and 1F1B both take (m + p - 1) units of a micro-batch's stage time
    (bubble (p - 1) / (m + p - 1)); GPipe keeps all m micro-batches alive, 1F1B at most p - r."""
    for name in ("gpipe", "1f1b"):
        sim = simulate(name, stages, micro)
        assert sim.makespan == pytest.approx(3 * (micro + stages - 1))
        assert sim.bubble == pytest.approx((stages - 1) / (micro + stages - 1))
    assert simulate("gpipe", stages, micro).peak_in_flight == [micro] * stages
    assert simulate("1f1b", stages, micro).peak_in_flight == [
        min(micro, stages - r) for r in range(stages)
    ]
    if micro % stages == 0:  # interleaving divides the bubble by the chunks
        per_chunk = [0.5] * (2 * stages)  # the same total work in two chunks per stage
        inter = simulate("interleaved_1f1b", stages, micro, 2, forward_time=per_chunk)
        assert inter.bubble < simulate("1f1b", stages, micro).bubble


def test_evaluation_keeps_only_forwards() -> None:
    actions = actions_for("1f1b", 2, 4, 0, train=False)
    assert [a.kind for a in actions] == ["F"] * 4


def _brute_force(costs: StageCosts, stages: int) -> float:
    n = len(costs.layers)
    best = float("inf")
    for cuts in itertools.combinations(range(1, n), stages - 1):
        split = [b - a for a, b in zip((0, *cuts), (*cuts, n))]
        best = min(best, max(costs.of_split(split)))
    return best


def test_partitioner_finds_the_slowest_stage_minimum() -> None:
    rng = random.Random(0)
    for _ in range(50):
        n, stages = rng.randint(2, 9), rng.randint(1, 4)
        stages = min(stages, n)
        costs = StageCosts(
            [rng.uniform(0.5, 2) for _ in range(n)],
            rng.uniform(0, 1),
            rng.uniform(0, 4),
            rng.uniform(0, 0.3),
        )
        split = best_split(costs, stages)
        assert sum(split) == n and len(split) == stages and min(split) >= 1
        assert max(costs.of_split(split)) == pytest.approx(_brute_force(costs, stages))


def test_balanced_split_is_even_and_a_heavy_head_moves_layers_forward() -> None:
    assert best_split(StageCosts([1.0] * 8), 4) == [2, 2, 2, 2]
    assert best_split(StageCosts([1.0] * 4, head=1.5), 2) == [3, 1]


@pytest.mark.parametrize(
    ("split", "message"),
    [
        ([2, 1], r"pipeline_layers=\[2, 1\] sums to 3 layers; the model has model.num_layers=4"),
        ([4], r"has 1 entries; parallel.pipeline=2 needs 2"),
        ([4, 0], r"every stage needs at least one layer"),
    ],
)
def test_bad_splits_name_the_values(split: list, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        check_split(split, 4, 2, "parallel.pipeline=2")
    with pytest.raises(ValueError, match=r"parallel.pipeline must be between 1 and 4"):
        best_split(StageCosts([1.0] * 4), 5)


def test_a_model_without_pipeline_parts_is_named_with_what_it_lacks() -> None:
    from torch import nn

    from tpformer.parallel.pipeline.stage import build_stage, pipelined

    class Half(nn.Module):
        pipeline_embedding = ("embedding",)

        def blocks(self) -> list[nn.Module]:
            return []

    message = (
        r"Half cannot be pipelined \(parallel.pipeline > 1\): it lacks embed\(\), "
        r"block_mask\(\), block_positions\(\), head\(\), pipeline_head; a pipelined model defines"
    )
    with pytest.raises(ValueError, match=message):
        pipelined(Half())
    with pytest.raises(ValueError, match=message):
        build_stage(Half(), [1, 1], 0, 2)


def _replicated_brute_force(
    costs: StageCosts,
    sizes: list[float],
    workers: int,
    bw: float,
    stage_count: int | None = None,
    divides: int | None = None,
) -> float:
    n, best = len(costs.layers), float("inf")
    prefix = [sum(sizes[:i]) for i in range(n + 1)]
    for stages in [stage_count] if stage_count else range(1, min(n, workers) + 1):
        for cuts in itertools.combinations(range(1, n), stages - 1):
            bounds = list(zip((0, *cuts), (*cuts, n)))
            for replicas in itertools.product(range(1, workers + 1), repeat=stages):
                if sum(replicas) != workers:
                    continue
                if divides and any(divides % m for m in replicas):
                    continue
                slowest = max(
                    max(costs.stage_cost(a, b), 2 * (m - 1) / m * (prefix[b] - prefix[a]) / bw) / m
                    for (a, b), m in zip(bounds, replicas)
                )
                best = min(best, slowest)
    return best


def test_pipedream_partition_finds_the_best_split_and_replication() -> None:
    """PipeDream's (split, replicas) dynamic program equals exhaustive search; a stage whose
    weights are cheap to synchronize is replicated, one whose sync dominates is not."""
    from tpformer.planner.partition import pipedream_partition, replication_string

    rng = random.Random(1)
    for _ in range(40):
        n, workers = rng.randint(1, 6), rng.randint(1, 5)
        costs = StageCosts(
            [rng.uniform(0.5, 2) for _ in range(n)], rng.uniform(0, 1), rng.uniform(0, 3), 0.1
        )
        sizes = [rng.uniform(0, 4) for _ in range(n)]
        stages, slowest = pipedream_partition(costs, sizes, workers, 2.0)
        assert sum(s.layers for s in stages) == n and sum(s.replicas for s in stages) == workers
        assert slowest == pytest.approx(_replicated_brute_force(costs, sizes, workers, 2.0))
    # the first layer heavy to compute and light to sync, the others heavy to sync: "2-1"
    heavy_first = StageCosts([4.0, 1.0, 1.0])
    stages, _ = pipedream_partition(heavy_first, [0.1, 3.0, 3.0], 3, 1.0)
    assert replication_string(stages) == "2-1" and [s.layers for s in stages] == [1, 2]
    # weights too costly to all-reduce: no replication, a plain pipeline
    stages, _ = pipedream_partition(heavy_first, [100.0, 100.0, 100.0], 3, 1.0)
    assert replication_string(stages) == "1-1-1"


def test_pipedream_partition_keeps_the_stage_count_and_divisible_replicas() -> None:
    """`stages` (parallel.pipeline) fixes the count, `divides` (the step's micro-batches) the
    allowed replica counts; each equals exhaustive search under the same constraint."""
    from tpformer.planner.partition import pipedream_partition

    rng = random.Random(2)
    for _ in range(40):
        n, workers = rng.randint(2, 6), rng.randint(2, 6)
        count, divides = rng.randint(1, min(n, workers)), rng.choice([None, 2, 4, 6])
        costs = StageCosts([rng.uniform(0.5, 2) for _ in range(n)], 0.2, rng.uniform(0, 3), 0.1)
        sizes = [rng.uniform(0, 4) for _ in range(n)]
        want = _replicated_brute_force(costs, sizes, workers, 2.0, count, divides)
        if want == float("inf"):
            continue
        stages, slowest = pipedream_partition(
            costs, sizes, workers, 2.0, stages=count, divides=divides
        )
        assert len(stages) == count and sum(s.replicas for s in stages) == workers
        if divides:
            assert all(divides % s.replicas == 0 for s in stages)
        assert slowest == pytest.approx(want)
    cheap_sync = StageCosts([4.0, 1.0, 1.0, 1.0])
    with pytest.raises(ValueError, match=r"replica counts that divide the 3 micro-batches"):
        pipedream_partition(cheap_sync, [0.0] * 4, 5, 1.0, stages=2, divides=3)
