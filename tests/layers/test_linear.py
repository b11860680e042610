"""Column/row parallel linear against nn.Linear, and the communication of a column->row block."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tests.dist import run_distributed
from tests.tolerances import FP32_LAYER_REL, assert_rel_close, seeded, shard
from tpformer.layers.linear import ColumnParallelLinear, RowParallelLinear
from tpformer.parallel.comm import count_collectives
from tpformer.parallel.context import ParallelContext

IN, OUT = 16, 8


def _reference() -> tuple[nn.Linear, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)  # identical on every rank
    ref = nn.Linear(IN, OUT)
    x = torch.randn(2, 3, IN, generator=seeded(1))
    grad_out = torch.randn(2, 3, OUT, generator=seeded(2))
    return ref, x, grad_out


def _column(ctx: ParallelContext, gather_output: bool) -> None:
    tp = ctx.tp
    ref, x, grad_out = _reference()
    layer = ColumnParallelLinear(IN, OUT, tp, gather_output=gather_output)
    layer.load_full_state_dict(ref.state_dict())
    x_ref, x_tp = x.clone().requires_grad_(), x.clone().requires_grad_()
    out_ref, out = ref(x_ref), layer(x_tp)
    g = grad_out if gather_output else shard(grad_out, -1, tp.rank, tp.size)
    out_ref.backward(grad_out)
    out.backward(g)
    expected = out_ref if gather_output else shard(out_ref, -1, tp.rank, tp.size)
    assert_rel_close(out, expected, FP32_LAYER_REL, "output")
    assert_rel_close(x_tp.grad, x_ref.grad, FP32_LAYER_REL, "input grad")
    assert_rel_close(layer.weight.grad, shard(ref.weight.grad, 0, tp.rank, tp.size), FP32_LAYER_REL)
    assert_rel_close(layer.bias.grad, shard(ref.bias.grad, 0, tp.rank, tp.size), FP32_LAYER_REL)
    assert_rel_close(layer.full_state_dict()["weight"], ref.weight, 0.0, "round trip")


def _row(ctx: ParallelContext, input_is_parallel: bool) -> None:
    tp = ctx.tp
    ref, x, grad_out = _reference()
    layer = RowParallelLinear(IN, OUT, tp, input_is_parallel=input_is_parallel)
    layer.load_full_state_dict(ref.state_dict())
    x_ref = x.clone().requires_grad_()
    x_tp = (shard(x, -1, tp.rank, tp.size) if input_is_parallel else x).clone().requires_grad_()
    out_ref, out = ref(x_ref), layer(x_tp)
    out_ref.backward(grad_out)
    out.backward(grad_out)
    assert_rel_close(out, out_ref, FP32_LAYER_REL, "output")
    expected_grad = shard(x_ref.grad, -1, tp.rank, tp.size) if input_is_parallel else x_ref.grad
    assert_rel_close(x_tp.grad, expected_grad, FP32_LAYER_REL, "input grad")
    assert_rel_close(layer.weight.grad, shard(ref.weight.grad, 1, tp.rank, tp.size), FP32_LAYER_REL)
    assert_rel_close(layer.bias.grad, ref.bias.grad, FP32_LAYER_REL, "bias grad")


@pytest.mark.parametrize("tp", [1, 2, 4])
@pytest.mark.parametrize("gather_output", [False, True])
def test_column_parallel_matches_linear(tp: int, gather_output: bool) -> None:
    run_distributed(_column, tp, gather_output, tensor=tp)


@pytest.mark.parametrize("tp", [1, 2, 4])
@pytest.mark.parametrize("input_is_parallel", [True, False])
def test_row_parallel_matches_linear(tp: int, input_is_parallel: bool) -> None:
    run_distributed(_row, tp, input_is_parallel, tensor=tp)


def _mlp_block(ctx: ParallelContext) -> dict[str, int]:
    tp = ctx.tp
    torch.manual_seed(0)
    fc1, fc2 = nn.Linear(IN, 4 * IN), nn.Linear(4 * IN, IN)
    col = ColumnParallelLinear(IN, 4 * IN, tp)
    row = RowParallelLinear(4 * IN, IN, tp)
    col.load_full_state_dict(fc1.state_dict())
    row.load_full_state_dict(fc2.state_dict())
    x = torch.randn(4, IN, generator=seeded(3))
    x_tp = x.clone().requires_grad_()
    with count_collectives() as forward:
        out = row(F.gelu(col(x_tp)))
    with count_collectives() as backward:
        out.sum().backward()
    x_ref = x.clone().requires_grad_()
    fc2(F.gelu(fc1(x_ref))).sum().backward()
    assert_rel_close(out, fc2(F.gelu(fc1(x))), FP32_LAYER_REL, "block output")
    assert_rel_close(x_tp.grad, x_ref.grad, FP32_LAYER_REL, "block input grad")
    return {
        "forward": sum(forward.values()),
        "backward": sum(backward.values()),
        "forward_all_reduce": forward["all_reduce"],
        "backward_all_reduce": backward["all_reduce"],
    }


@pytest.mark.parametrize("tp", [2, 4])
def test_column_row_block_issues_one_all_reduce_each_way(tp: int) -> None:
    for counts in run_distributed(_mlp_block, tp, tensor=tp):
        assert counts == {
            "forward": 1,
            "backward": 1,
            "forward_all_reduce": 1,
            "backward_all_reduce": 1,
        }


def _bad_sizes(ctx: ParallelContext) -> list[str]:
    messages = []
    for build in (
        lambda: ColumnParallelLinear(16, 6, ctx.tp),
        lambda: RowParallelLinear(6, 16, ctx.tp),
    ):
        with pytest.raises(ValueError) as info:
            build()
        messages.append(str(info.value))
    return messages


def test_indivisible_features_raise_before_any_collective() -> None:
    (col, row), _, _, _ = run_distributed(_bad_sizes, 4, tensor=4)
    assert col.startswith(
        "out_features=6 is not divisible by tp=4; valid tp degrees for it are [1, 2, 3, 6]"
    )
    assert row.startswith("in_features=6 is not divisible by tp=4")
