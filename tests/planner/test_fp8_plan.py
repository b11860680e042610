"""The planner's step time under parallel.precision=fp8: the blocks' linear matmuls at the
cluster's fp8 peak (cluster.peak_tflops_fp8: H100's 1,979 against 989 TFLOP/s), plus the casts'
bytes at memory bandwidth; without an fp8 peak (A100) the matmuls keep the 16-bit rate and the
casts only cost. (The activations fp8 keeps: tests/train/test_dry_run.py.)"""

from __future__ import annotations

import pytest

from tpformer.config.presets import preset
from tpformer.config.schema import Config, DataConfig, ParallelConfig, TrainerConfig
from tpformer.planner.candidate import Workload, candidate_of
from tpformer.planner.cluster import accelerator_cluster
from tpformer.planner.step_time import fp8_cast_bytes, gemms_time, layer_gemms, layer_time


def _work(precision: str) -> tuple[Workload, object]:
    config = Config(
        model=preset("bert_large"),
        parallel=ParallelConfig(precision=precision),  # type: ignore[arg-type]
        data=DataConfig(source="synthetic", seq_length=512),  # type: ignore[arg-type]
        trainer=TrainerConfig(micro_batch_size=16),
    )
    return Workload.of(config, 16), candidate_of(config, 1)


@pytest.mark.parametrize(("cluster", "speedup"), [("h100_node", 1979 / 989), ("a100_node", 1.0)])
def test_fp8_prices_the_linears_at_the_fp8_peak_and_the_casts_at_bandwidth(
    cluster: str, speedup: float
) -> None:
    (bf16, c), (fp8, _) = _work("bf16"), _work("fp8")
    cl16, cl8 = accelerator_cluster(1, "bf16", cluster), accelerator_cluster(1, "fp8", cluster)
    assert cl8.fp8_speedup == pytest.approx(speedup)
    linears = sum(gemms_time(cl16, layer_gemms(bf16, c)[:4], bf16.itemsize))
    casts = fp8_cast_bytes(fp8, c) / cl8.memory_bandwidth
    assert casts > 0
    want = layer_time(bf16, c, cl16) - linears + linears / speedup + casts
    assert layer_time(fp8, c, cl8) == pytest.approx(want, rel=1e-12)
    if cluster == "h100_node":  # faster, by less than the peaks' ratio (attention, elementwise)
        assert 1.1 < layer_time(bf16, c, cl16) / layer_time(fp8, c, cl8) < speedup


def test_planning_fp8_for_gpus_asks_nothing_of_this_machines_gpu() -> None:
    """The config rules hold for a GPU cluster planned from a machine without one (this CPU
    build has no CUDA): fp8's hardware check belongs to the run (cli/shell.py), not the rules."""
    from tpformer.config.validate import validate
    from tpformer.parallel.layout import resolve_layout

    config = Config(
        model=preset("bert_large"),
        parallel=ParallelConfig(precision="fp8", tensor=2),  # type: ignore[arg-type]
        data=DataConfig(source="synthetic", seq_length=512),  # type: ignore[arg-type]
    )
    validate(config, resolve_layout(2, "auto", 8, 1), device_type="cuda")
