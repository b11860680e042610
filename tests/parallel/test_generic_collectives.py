"""The layouts with parallel.gloo_shortcuts=false: every collective takes the generic path that
NCCL takes (all-reduce, reduce-scatter and all-gather as collectives, not the two-rank swaps or
gloo's all-reduce-then-slice), and TP + SP, ZeRO-2, ZeRO-3 and the pipeline still give the
one-process loss curve (1e-5, the layout tests' tolerance)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.dist import run_distributed
from tests.pipeline.test_pipeline_training import _assert_same_curves, _curves, pipeline_config
from tpformer.parallel.comm import all_gather_async, all_reduce_async, reduce_scatter_async
from tpformer.parallel.context import ParallelContext

LAYOUTS = [  # (world, run_distributed kwargs, parallel keys, micro, accum)
    (2, {"tensor": 2, "sequence_parallel": True}, {}, 8, 1),
    (2, {}, {"zero_stage": 2}, 4, 1),
    (2, {}, {"zero_stage": 3}, 4, 1),
    (2, {"pipeline": 2}, {}, 2, 4),
]


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> list[tuple[float, ...]]:
    """The one-process curve, global batch 8."""
    run_dir = str(tmp_path_factory.mktemp("reference"))
    return _curves(ParallelContext.single(device="cpu"), pipeline_config(), run_dir)


@pytest.mark.sweep
@pytest.mark.parametrize(("world", "layout", "keys", "micro", "accum"), LAYOUTS)
def test_layouts_on_the_generic_collectives_give_the_one_process_curve(
    tmp_path: Path,
    reference: list[tuple[float, ...]],
    world: int,
    layout: dict,
    keys: dict,
    micro: int,
    accum: int,
) -> None:
    config = pipeline_config(micro=micro, accum=accum, gloo_shortcuts=False, **keys, **layout)
    for curves in run_distributed(
        _curves, world, config, str(tmp_path / "run"), gloo_shortcuts=False, **layout
    ):
        _assert_same_curves(curves, reference)


def _pending_types(ctx: ParallelContext) -> list[str]:
    x = torch.ones(8)
    works = [
        all_reduce_async(x, ctx.dp),
        reduce_scatter_async(torch.empty(4), torch.ones(8), ctx.dp),
        all_gather_async(torch.empty(8), torch.ones(4), ctx.dp),
    ]
    for work in works:
        assert work is not None
        work.wait()
    return [type(work).__name__ for work in works]


@pytest.mark.parametrize("shortcuts", [True, False])
def test_the_switch_chooses_the_path(shortcuts: bool) -> None:
    """Two gloo ranks: the swaps with the shortcuts, the library's collectives without."""
    types = run_distributed(_pending_types, 2, gloo_shortcuts=shortcuts)[0]
    assert types == (["PairExchange"] * 3 if shortcuts else ["Timed"] * 3)
