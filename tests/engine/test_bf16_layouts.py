"""bf16 in every layout: TP, TP + SP, DP with ZeRO 1/2/3, CPU offload, pipeline and
recomputation follow the one-process bf16 run (and fp32) within bf16's tolerance; for BERT,
and in a few layouts for the Llama-style decoder and the ModernBERT-style encoder."""

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

LAYOUTS = [  # (arch, world, run_distributed kwargs, parallel keys, micro, accum)
    ("bert", 2, {"tensor": 2}, {"recompute": "selective"}, 8, 1),
    ("bert", 2, {"tensor": 2, "sequence_parallel": True}, {}, 8, 1),
    ("bert", 2, {}, {"zero_stage": 1}, 4, 1),
    ("bert", 2, {}, {"zero_stage": 2, "recompute": "full"}, 4, 1),
    ("bert", 2, {}, {"zero_stage": 3, "cpu_offload": "optimizer+params"}, 4, 1),
    ("bert", 2, {"pipeline": 2}, {}, 2, 4),
    ("llama", 2, {"tensor": 2, "sequence_parallel": True}, {}, 8, 1),
    ("llama", 2, {}, {"zero_stage": 3, "cpu_offload": "optimizer+params"}, 4, 1),
    ("modernbert", 2, {"tensor": 2, "sequence_parallel": True}, {}, 8, 1),
    ("modernbert", 2, {"pipeline": 2}, {"recompute": "full"}, 2, 4),
]


def _losses(ctx: ParallelContext, config: Config, run_dir: str) -> list[float]:
    return [r["loss"] for r in pretraining_trainer(config, ctx, Path(run_dir)).train()]


@pytest.fixture(scope="module")
def one_process(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], list[float]]:
    """The one-process bf16 and fp32 curves of each arch, global batch 8 (computed lazily)."""

    class Lazy(dict):
        def __missing__(self, key: tuple[str, str]) -> list[float]:
            arch, precision = key
            config = pipeline_config(arch, steps=STEPS, micro=8, precision=precision)
            run_dir = str(tmp_path_factory.mktemp(f"{arch}_{precision}"))
            self[key] = _losses(ParallelContext.single(device="cpu"), config, run_dir)
            return self[key]

    return Lazy()


@pytest.mark.sweep
@pytest.mark.parametrize(("arch", "world", "layout", "keys", "micro", "accum"), LAYOUTS)
def test_bf16_layouts_follow_the_one_process_bf16_and_fp32_runs(
    tmp_path: Path,
    one_process: dict[tuple[str, str], list[float]],
    arch: str,
    world: int,
    layout: dict,
    keys: dict,
    micro: int,
    accum: int,
) -> None:
    bf16, fp32 = one_process[arch, "bf16"], one_process[arch, "fp32"]
    config = pipeline_config(
        arch, steps=STEPS, micro=micro, accum=accum, precision="bf16", **keys, **layout
    )
    for losses in run_distributed(_losses, world, config, str(tmp_path / "run"), **layout):
        for got, one, full in zip(losses, bf16, fp32, strict=True):
            assert abs(got - one) <= BF16_LAYOUT_REL * one, (losses, bf16)
            assert abs(got - full) <= BF16_FP32_REL * full, (losses, fp32)
