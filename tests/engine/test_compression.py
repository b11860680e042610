"""Compressed DP gradient reduction: the same losses at every TP layout for a fixed DP degree,
a real change against uncompressed, error feedback that converges on a quadratic, and the
settings the validator refuses."""

from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch import nn

from tests.dist import run_distributed
from tests.tolerances import seeded
from tests.train.test_trainer import _curves, tiny_config
from tpformer.config.rules.parallel import validate_engine
from tpformer.config.schema import OptimConfig, ParallelConfig
from tpformer.engine.compression import PowerSGD
from tpformer.engine.flat_buffer import FlatBucket
from tpformer.parallel.context import ParallelContext

COMPRESSED_REL = 1e-5
"""fp32; bf16 rounding or PowerSGD's factors of the same sums, reduced in another order."""


def _losses(tmp_path: Path, tp: int, **parallel: object) -> list[float]:
    config = tiny_config(steps=6, micro=4, tensor=tp, **parallel)
    results = run_distributed(_curves, 2 * tp, config, str(tmp_path / f"tp{tp}"), tensor=tp)
    return [loss for loss, _, _ in results[0]]


@pytest.fixture(scope="module")
def uncompressed(tmp_path_factory: pytest.TempPathFactory) -> Callable[[int], list[float]]:
    """The uncompressed DP=2 losses at a ZeRO stage, run once per stage for the module."""
    runs: dict[int, list[float]] = {}

    def losses(stage: int) -> list[float]:
        if stage not in runs:
            runs[stage] = _losses(tmp_path_factory.mktemp(f"plain{stage}"), 1, zero_stage=stage)
        return runs[stage]

    return losses


@pytest.mark.sweep
@pytest.mark.parametrize(
    ("compression", "stage"), [("bf16", 1), ("bf16", 2), ("powersgd", 0), ("powersgd", 1)]
)
def test_compressed_losses_are_the_same_at_every_tp_layout(
    tmp_path: Path, compression: str, stage: int, uncompressed: Callable[[int], list[float]]
) -> None:
    """DP=2 at TP=1 and TP=2 (dropout 0.1), compression from the second step on: it acts on DP
    only, on the logical parameters, so TP does not change the run; and it does change it."""
    extra = {
        "grad_compression": compression,
        "zero_stage": stage,
        "powersgd_start_step": 1,
        "powersgd_rank": 2,
    }
    plain = uncompressed(stage)
    one = _losses(tmp_path / "one", 1, **extra)
    two = _losses(tmp_path / "two", 2, **extra)
    for got, want in zip(two, one):
        assert abs(got - want) <= COMPRESSED_REL * want, (two, one)
    assert one[0] == plain[0]  # the first step's update has not landed yet
    assert max(abs(a - b) for a, b in zip(one, plain)) > 1e-6, (one, plain)


def _quadratic(ctx: ParallelContext, lr: float, feedback: bool) -> tuple[float, float]:
    """Gradient descent on f_d(W) = |W - T_d|^2 / 2 per DP rank with the gradient sum
    compressed to rank 1. Returns (relative error of the accumulated compressed update against
    the accumulated uncompressed one, relative distance of W to the minimizer, the mean target)."""
    weight = nn.Parameter(torch.zeros(24, 16))
    bucket = FlatBucket([("w", weight)], ctx.dp.size, ctx.dp.rank)
    powersgd = PowerSGD(
        [bucket], ctx.dp, ctx.tp, rank=1, start_step=0, seed=0, device=torch.device("cpu")
    )
    targets = [torch.randn(24, 16, generator=seeded(d)) for d in range(ctx.dp.size)]
    goal = sum(targets) / len(targets)
    w = torch.zeros(24, 16)
    compressed, exact = torch.zeros(24, 16), torch.zeros(24, 16)
    for _ in range(800):
        whole = torch.zeros(bucket.padded_numel)
        bucket.view(whole, bucket.segments[0]).copy_(w - targets[ctx.dp.rank])
        powersgd.reduce(0, whole)
        if not feedback:
            powersgd.matrices[0][0].error.zero_()
        update = bucket.view(whole, bucket.segments[0]) / ctx.dp.size
        compressed += update
        exact += w - goal  # the uncompressed mean gradient at the same point
        w -= lr * update
    return (
        float((compressed - exact).norm() / exact.norm()),
        float((w - goal).norm() / goal.norm()),
    )


@pytest.mark.slow  # over ~5 s: the slow tier
def test_error_feedback_makes_the_accumulated_update_the_uncompressed_one() -> None:
    """At a fixed point (lr 0) the accumulated rank-1 updates differ from the uncompressed ones
    by the current error only, so their relative error vanishes; without feedback they keep
    only the top direction. Descending (lr 0.2) reaches the uncompressed minimizer."""
    ((accumulated, _),) = run_distributed(_quadratic, 2, 0.0, True)[:1]
    ((lost, _),) = run_distributed(_quadratic, 2, 0.0, False)[:1]
    assert accumulated < 0.02 and lost > 0.3, (accumulated, lost)
    ((_, distance),) = run_distributed(_quadratic, 2, 0.2, True)[:1]
    assert distance < 1e-3, distance


@pytest.mark.parametrize(
    ("parallel", "message"),
    [
        (
            ParallelConfig(grad_compression="powersgd", zero_stage=2),
            r"parallel.grad_compression=powersgd needs parallel.zero_stage 0 or 1 \(got 2\)",
        ),
        (
            ParallelConfig(grad_compression="topk"),
            r"parallel.grad_compression='topk' is not one of \['none', 'bf16', 'powersgd'\]",
        ),
        (
            ParallelConfig(grad_compression="powersgd", powersgd_rank=0),
            r"parallel.powersgd_rank=0 must be >= 1",
        ),
    ],
)
def test_bad_compression_settings_raise(parallel: ParallelConfig, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        validate_engine(parallel, OptimConfig(), "cpu")
