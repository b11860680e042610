"""The four autograd collectives: values and gradients in both directions, and their counts."""

import pytest
import torch

from tests.dist import run_distributed
from tests.tolerances import seeded, shard
from tpformer.parallel.comm import (copy_to_tp, count_collectives, gather_from_tp, reduce_from_tp,
                                    scatter_to_tp)
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
    assert torch.equal(x.grad, shard(torch.arange(full.numel(), dtype=torch.float32).view_as(full),
                                     -1, tp.rank, n))


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_collectives_forward_and_backward(tp: int) -> None:
    run_distributed(_collectives, tp, tensor=tp)
