"""Pure layout arithmetic: no processes."""

import pytest

from tpformer.parallel.layout import (
    Layout,
    divide,
    pad_to_multiple,
    provisional_replicas,
    replicated_layout,
    resolve_layout,
    shard_range,
)


def test_divide_and_shard_range() -> None:
    assert divide(12, 4, what="num_heads") == 3
    assert shard_range(12, 4, 2) == (6, 9)
    assert pad_to_multiple(30522, 256) == 30720
    with pytest.raises(
        ValueError, match=r"num_heads=12 is not divisible by tp=5.*\[1, 2, 3, 4, 6, 12\]"
    ):
        divide(12, 5, what="num_heads")


def test_resolve_layout_auto_and_explicit() -> None:
    assert resolve_layout(2, "auto", 8) == Layout(dp=4, tp=2)
    assert resolve_layout(2, "4", 8) == Layout(dp=4, tp=2)
    assert resolve_layout(1, 4, 4) == Layout(dp=4, tp=1)


def test_rank_grids_keep_tp_adjacent() -> None:
    layout = Layout(dp=2, tp=4)
    assert layout.tp_groups() == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert layout.dp_groups() == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert layout.coords(6) == (1, 2)


@pytest.mark.parametrize(
    ("tensor", "data", "world", "message"),
    [
        (
            3,
            "auto",
            4,
            r"parallel.tensor=3 does not divide world_size=4; valid values are \[1, 2, 4\]",
        ),
        (2, "3", 4, r"parallel.data=3 x parallel.tensor=2 = 6 must equal world_size=4"),
        (0, "auto", 4, r"parallel.tensor=0 must be >= 1"),
        (1, "two", 2, r"parallel.data='two' must be a positive integer or 'auto'"),
    ],
)
def test_bad_layouts_name_the_values(tensor: int, data: str, world: int, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        resolve_layout(tensor, data, world)


def test_replicated_stages_route_micro_batches_round_robin() -> None:
    """PipeDream's "1-3-2": stage r on consecutive ranks; micro-batch i runs on replica
    i mod n of each stage; the replicas of a stage are its DP group."""
    layout = replicated_layout([1, 3, 2], 6, pipeline=3)
    assert layout.world_size == 6 and layout.pp == 3
    assert [layout.stage_of(r) for r in range(6)] == [0, 1, 1, 1, 2, 2]
    assert [layout.replica_of(r) for r in range(6)] == [0, 0, 1, 2, 0, 1]
    assert [layout.peer(1, i) for i in range(4)] == [1, 2, 3, 1]
    assert [layout.peer(2, i) for i in range(3)] == [4, 5, 4]
    assert layout.dp_groups() == [[0], [1, 2, 3], [4, 5]]
    assert layout.describe() == "pp3 replicas 1-3-2 tp1"
    assert Layout(dp=2, tp=1, pp=2).peer(1, 5) == 1  # regular: the stage in its own pipeline


@pytest.mark.parametrize(
    ("replicas", "kwargs", "message"),
    [
        ([2, 1], {}, r"pipeline_replicas=\[2, 1\] uses 3 workers but world_size=4"),
        ([2, 1, 1], {"pipeline": 2}, r"names 3 stages but parallel.pipeline=2"),
        ([4], {}, r"needs one worker count >= 1 per pipeline stage, at least two stages"),
        ([3, 0], {}, r"needs one worker count >= 1 per pipeline stage"),
        ([2, 2], {"tensor": 2}, r"set parallel.tensor=1, parallel.context=1 and parallel.data"),
        ([2, 2], {"data": "2"}, r"\(got tensor=1, context=1, data=2\)"),
    ],
)
def test_bad_replicas_are_named(replicas: list[int], kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        replicated_layout(replicas, 4, **kwargs)
    with pytest.raises(ValueError, match=r"pipeline=3 stages on world_size=2 ranks"):
        provisional_replicas(2, 3)
    assert provisional_replicas(4, 2) == [3, 1]
