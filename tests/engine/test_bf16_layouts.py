"""bf16 in every layout: TP, TP + SP, DP with ZeRO 1/2/3, CPU offload, pipeline and
recomputation follow the one-process bf16 run (and fp32) within bf16's tolerance."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.dist import run_distributed
from tests.pipeline.test_pipeline_training import pipeline_config
from tpformer.config.schema import Config
from tpformer.parallel.context import ParallelContext
from tpformer.train.pretraining import pretraining_trainer

STEPS = 6
BF16_LAYOUT_REL = 1e-3
"""bf16 at a layout vs bf16 in one process, relative: the same math in another order, rounded to
8 mantissa bits at other points (measured over these 6 steps, dropout 0.1: at most 1.2e-4)."""
BF16_FP32_REL = 3e-3
"""bf16 at a layout vs fp32 in one process, relative (measured: at most 3.7e-4)."""

LAYOUTS = [  # (world, run_distributed kwargs, parallel keys, micro, accum)
    (2, {"tensor": 2}, {"recompute": "selective"}, 8, 1),
    (2, {"tensor": 2, "sequence_parallel": True}, {}, 8, 1),
    (2, {}, {"zero_stage": 1}, 4, 1),
    (2, {}, {"zero_stage": 2, "recompute": "full"}, 4, 1),
    (2, {}, {"zero_stage": 3, "cpu_offload": "optimizer+params"}, 4, 1),
    (2, {"pipeline": 2}, {}, 2, 4),
]


def _losses(ctx: ParallelContext, config: Config, run_dir: str) -> list[float]:
    return [r["loss"] for r in pretraining_trainer(config, ctx, Path(run_dir)).train()]


@pytest.fixture(scope="module")
def one_process(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[float]]:
    """The one-process bf16 and fp32 curves, global batch 8."""
    curves = {}
    for precision in ("bf16", "fp32"):
        config = pipeline_config(steps=STEPS, micro=8, precision=precision)
        run_dir = tmp_path_factory.mktemp(precision)
        curves[precision] = _losses(ParallelContext.single(device="cpu"), config, str(run_dir))
    return curves


@pytest.mark.parametrize(("world", "layout", "keys", "micro", "accum"), LAYOUTS)
def test_bf16_layouts_follow_the_one_process_bf16_and_fp32_runs(
    tmp_path: Path,
    one_process: dict[str, list[float]],
    world: int,
    layout: dict,
    keys: dict,
    micro: int,
    accum: int,
) -> None:
    bf16, fp32 = one_process["bf16"], one_process["fp32"]
    config = pipeline_config(
        steps=STEPS, micro=micro, accum=accum, precision="bf16", **keys, **layout
    )
    for losses in run_distributed(_losses, world, config, str(tmp_path / "run"), **layout):
        for got, one, full in zip(losses, bf16, fp32, strict=True):
            assert abs(got - one) <= BF16_LAYOUT_REL * one, (losses, bf16)
            assert abs(got - full) <= BF16_FP32_REL * full, (losses, fp32)
