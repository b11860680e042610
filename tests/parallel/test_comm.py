"""The four autograd collectives: values and gradients in both directions, and their counts;
the flat DP collectives of the ZeRO engine on every path (one rank, the two-rank exchange,
gloo's all-reduce for more ranks, and with parallel.gloo_shortcuts=false the generic
reduce-scatter and all-gather NCCL takes), several in flight at once."""

import pytest
import torch

from tests.dist import run_distributed
from tests.tolerances import seeded, shard
from tpformer.parallel.comm import (
    all_gather_async,
    copy_to_tp,
    count_collectives,
    gather_from_tp,
    reduce_from_tp,
    reduce_scatter_async,
    scatter_to_tp,
    wait,
)
from tpformer.parallel.context import ParallelContext


def _collectives(ctx: ParallelContext) -> None:
    tp, n = ctx.tp, ctx.tp.size
    full = torch.randn(3, 4 * n, generator=seeded(0))
    mine = full + ctx.tp.rank  # differs per rank

    with count_collectives() as counts:
        x = mine.clone().requires_grad_()
        copy_to_tp(x, tp).backward(torch.ones_like(x) * (tp.rank + 1))
    assert torch.equal(x.grad, torch.full_like(x, n * (n + 1) / 2))
    assert counts["all_reduce"] == (1 if n > 1 else 0)

    x = mine.clone().requires_grad_()
    y = reduce_from_tp(x, tp)
    assert torch.allclose(y, full * n + n * (n - 1) / 2)
    y.backward(torch.ones_like(y))
    assert torch.equal(x.grad, torch.ones_like(x))

    x = full.clone().requires_grad_()
    y = scatter_to_tp(x, tp)
    assert torch.equal(y, shard(full, -1, tp.rank, n))
    y.backward(torch.ones_like(y) * (tp.rank + 1))
    expected = torch.cat([torch.full((3, 4), r + 1.0) for r in range(n)], dim=-1)
    assert torch.equal(x.grad, expected)

    x = shard(full, -1, tp.rank, n).clone().requires_grad_()
    y = gather_from_tp(x, tp)
    assert torch.equal(y, full)
    y.backward(torch.arange(y.numel(), dtype=torch.float32).view_as(y))
    assert torch.equal(
        x.grad, shard(torch.arange(full.numel(), dtype=torch.float32).view_as(full), -1, tp.rank, n)
    )


@pytest.mark.parametrize(
    ("tp", "shortcuts"), [(1, True), (2, True), (4, True), (2, False), (4, False)]
)
def test_collectives_forward_and_backward(tp: int, shortcuts: bool) -> None:
    """gloo_shortcuts=False: the generic collectives NCCL takes, on gloo."""
    run_distributed(_collectives, tp, tensor=tp, gloo_shortcuts=shortcuts)


def _flat_dp_collectives(ctx: ParallelContext) -> None:
    dp, n = ctx.dp, ctx.dp.size
    per_rank = [torch.randn(12 * n, generator=seeded(r)) for r in range(n)]
    total = sum(per_rank[1:], per_rank[0])
    inputs = [per_rank[dp.rank] * (k + 1) for k in range(3)]
    outs = [torch.empty(12) for _ in range(3)]
    works = [reduce_scatter_async(out, x.clone(), dp) for out, x in zip(outs, inputs)]
    for work in works:  # three in flight, completed in order, as the engine's buckets are
        wait(work)
    for k, out in enumerate(outs):
        assert torch.allclose(out, (total * (k + 1)).chunk(n)[dp.rank], rtol=1e-6, atol=1e-6)
    in_place = per_rank[dp.rank].clone()  # ZeRO-1 reduces into its own chunk of the buffer
    own = in_place.chunk(n)[dp.rank]
    wait(reduce_scatter_async(own, in_place, dp))
    assert torch.allclose(own, total.chunk(n)[dp.rank], rtol=1e-6, atol=1e-6)
    shards = [torch.arange(12, dtype=torch.float32) + 100 * dp.rank + k for k in range(3)]
    gathered = [torch.full((12 * n,), float("nan")) for _ in range(3)]
    works = [all_gather_async(out, shard_, dp) for out, shard_ in zip(gathered, shards)]
    for work in works:
        wait(work)
    for k, out in enumerate(gathered):
        assert torch.equal(out, torch.cat([torch.arange(12.0) + 100 * r + k for r in range(n)]))


@pytest.mark.parametrize("shortcuts", [True, False])
@pytest.mark.parametrize("dp", [2, 4])
def test_flat_dp_reduce_scatter_and_all_gather(dp: int, shortcuts: bool) -> None:
    run_distributed(_flat_dp_collectives, dp, gloo_shortcuts=shortcuts)


def test_flat_dp_collectives_on_one_rank() -> None:
    run_distributed(_flat_dp_collectives, 1)
