"""Pure layout arithmetic: no processes."""

import pytest

from tpformer.parallel.layout import Layout, divide, pad_to_multiple, resolve_layout, shard_range


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
