"""ParallelContext over real gloo groups: mesh shape, group membership, teardown, bad input."""

import os

import pytest
import torch

from tests.dist import run_distributed
from tpformer.parallel.comm import all_reduce
from tpformer.parallel.context import ParallelContext
from tpformer.parallel.handle import GroupHandle


def _membership(ctx: ParallelContext) -> dict:
    # Sum of global ranks over each group tells which ranks are in it.
    tp_sum = all_reduce(torch.tensor([float(ctx.rank)]), ctx.tp).item()
    dp_sum = all_reduce(torch.tensor([float(ctx.rank)]), ctx.dp).item()
    pp_sum = all_reduce(torch.tensor([float(ctx.rank)]), ctx.pp).item()
    ends_sum = all_reduce(torch.tensor([float(ctx.rank)]), ctx.pipeline_ends).item()
    cp_sum = all_reduce(torch.tensor([float(ctx.rank)]), ctx.cp).item()
    replicas_sum = all_reduce(torch.tensor([float(ctx.rank)]), ctx.replicas).item()
    return {
        "cp": (ctx.cp.rank, ctx.cp.size),
        "replicas": (ctx.replicas.rank, ctx.replicas.size),
        "cp_sum": cp_sum,
        "replicas_sum": replicas_sum,
        "rank": ctx.rank,
        "tp": (ctx.tp.rank, ctx.tp.size),
        "dp": (ctx.dp.rank, ctx.dp.size),
        "pp": (ctx.pp.rank, ctx.pp.size),
        "pp_sum": pp_sum,
        "ends_sum": ends_sum,
        "tp_sum": tp_sum,
        "dp_sum": dp_sum,
        "mesh": ctx.mesh.mesh_dim_names,
        "shape": tuple(ctx.mesh.shape),
    }


@pytest.mark.parametrize(("world", "tp"), [(1, 1), (2, 2), (2, 1), (4, 2), (4, 4), (4, 1)])
def test_groups_follow_the_layout(world: int, tp: int) -> None:
    results = run_distributed(_membership, world, tensor=tp)
    dp = world // tp
    for r, res in enumerate(results):
        d, t = divmod(r, tp)
        assert res["tp"] == (t, tp) and res["dp"] == (d, dp)
        assert res["tp_sum"] == sum(d * tp + i for i in range(tp))
        assert res["dp_sum"] == sum(j * tp + t for j in range(dp))
        assert res["mesh"] == ("pp", "dp", "cp", "tp") and res["shape"] == (1, dp, 1, tp)
        assert res["replicas"] == res["dp"] and res["cp"] == (0, 1)


@pytest.mark.parametrize(("world", "tp", "cp"), [(2, 1, 2), (4, 2, 2), (4, 1, 2), (4, 1, 4)])
def test_context_parallel_groups_sit_between_dp_and_tp(world: int, tp: int, cp: int) -> None:
    """rank = (dp_rank x cp + cp_rank) x tp + tp_rank; ctx.cp is the ring of one (DP replica,
    TP rank), ctx.replicas spans DP x CP of one TP rank (what gradients are summed over)."""
    results = run_distributed(_membership, world, tensor=tp, context=cp)
    dp = world // (tp * cp)
    for r, res in enumerate(results):
        d, rest = divmod(r, cp * tp)
        c, t = divmod(rest, tp)
        assert res["tp"] == (t, tp) and res["dp"] == (d, dp) and res["cp"] == (c, cp)
        assert res["cp_sum"] == sum((d * cp + j) * tp + t for j in range(cp))
        assert res["dp_sum"] == sum((j * cp + c) * tp + t for j in range(dp))
        same_params = [(i * cp + j) * tp + t for i in range(dp) for j in range(cp)]
        assert res["replicas"] == (same_params.index(r), dp * cp)
        assert res["replicas_sum"] == sum(same_params)
        assert res["shape"] == (1, dp, cp, tp)


@pytest.mark.parametrize(("world", "tp", "pp"), [(2, 1, 2), (4, 2, 2), (4, 1, 4)])
def test_pipeline_stages_are_outermost(world: int, tp: int, pp: int) -> None:
    """rank = (pp_rank x dp + dp_rank) x tp + tp_rank; ctx.pp links a pipeline's stages and
    ctx.pipeline_ends its first and last stage (single on middle stages)."""
    results = run_distributed(_membership, world, tensor=tp, pipeline=pp)
    dp = world // (tp * pp)
    for r, res in enumerate(results):
        stage, rest = divmod(r, dp * tp)
        d, t = divmod(rest, tp)
        assert res["tp"] == (t, tp) and res["dp"] == (d, dp) and res["pp"] == (stage, pp)
        pipeline = [(s * dp + d) * tp + t for s in range(pp)]
        assert res["pp_sum"] == sum(pipeline)
        ends = [pipeline[0], pipeline[-1]]
        assert res["ends_sum"] == (sum(ends) if r in ends else r)
        assert res["shape"] == (pp, dp, 1, tp)


def _two_contexts_in_one_process(ctx: ParallelContext) -> float:
    # Teardown then rebuild in the same process: the harness destroyed nothing yet.
    ctx.destroy()
    assert not torch.distributed.is_initialized()
    return 1.0


def test_destroy_releases_the_groups() -> None:
    assert run_distributed(_two_contexts_in_one_process, 2, tensor=2) == [1.0, 1.0]


def _bad_layout_raises(ctx: ParallelContext) -> str:
    with pytest.raises(ValueError) as info:
        ParallelContext.create(tensor=3)
    return str(info.value)


def test_tp_not_dividing_world_raises_before_collectives() -> None:
    messages = run_distributed(_bad_layout_raises, 2, tensor=2)
    assert all("parallel.tensor=3 does not divide world_size=2" in m for m in messages)


def _wrong_group_size(ctx: ParallelContext) -> str:
    with pytest.raises(ValueError) as info:
        GroupHandle(group=ctx.tp.group, rank=0, size=4)
    return str(info.value)


def test_group_of_wrong_size_is_rejected() -> None:
    messages = run_distributed(_wrong_group_size, 2, tensor=2)
    assert all("process group has 2 ranks but the handle says size=4" in m for m in messages)


def test_uninitialized_distributed_names_the_missing_variables(monkeypatch) -> None:
    for var in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(var, raising=False)
    with pytest.raises(ValueError, match=r"torch.distributed is not initialized and RANK"):
        ParallelContext.create(tensor=1)


def test_single_context_has_trivial_groups() -> None:
    ctx = ParallelContext.single(seed=3, device="cpu")
    assert (ctx.tp.size, ctx.dp.size, ctx.tp.group) == (1, 1, None)
    assert os.environ.get("RANK") is None or ctx.rank == 0


def _mismatched_layouts(ctx: ParallelContext) -> str:
    with pytest.raises(ValueError) as info:  # over the harness's initialized process group
        ParallelContext.create(tensor=2 if ctx.rank == 0 else 1)
    return str(info.value)


def test_ranks_that_derive_different_layouts_stop_naming_them() -> None:
    """Rank 0 asks for TP=2, rank 1 for TP=1 (as a parallel.tensor=auto choice made from
    different calibration files would): both stop before any group is built, naming both."""
    messages = run_distributed(_mismatched_layouts, 2)
    for m in messages:
        assert "ranks derived different layouts (rank 0: pp1 dp1 tp2, rank 1: pp1 dp2 tp1)" in m
