"""The planner's pieces against what they model: parameter counts against built models at
TP 1/2, micro-batches in flight against the schedule simulator, and the startup plan's
warnings."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from tests.dist import run_distributed
from tests.models.common import tiny_bert, tiny_gpt
from tests.planner.test_memory_prediction import base_config
from tpformer.config.schema import ModelConfig
from tpformer.models import build_model
from tpformer.parallel.context import ParallelContext
from tpformer.parallel.layout import Layout
from tpformer.parallel.pipeline.simulate import simulate
from tpformer.planner.candidate import Candidate, Workload
from tpformer.planner.cluster import Link, load_preset, resolve_cluster
from tpformer.planner.memory import held_at_backward, stage_params
from tpformer.planner.step_time import pipeline_makespan
from tpformer.train.startup_report import predict_memory_of, prediction_lines


def _count(ctx: ParallelContext, model: ModelConfig, task: str) -> int:
    return sum(p.numel() for p in build_model(model, ctx, task=task).parameters())


@pytest.mark.parametrize(
    ("model", "task"), [(tiny_bert(), "pretraining"), (tiny_gpt(), "causal_lm")]
)
@pytest.mark.parametrize("tp", [1, 2])
def test_parameters_per_rank_match_the_built_model(model: ModelConfig, task: str, tp: int) -> None:
    work = Workload(model, 16, 8, "fp32", 0.15, nsp=model.arch == "bert")
    predicted = stage_params(work, Candidate(tp, 1, 1, 1, 1))[0].total
    if tp == 1:
        counts = [_count(ParallelContext.single(device="cpu"), model, task)]
    else:
        counts = run_distributed(_count, tp, model, task, tensor=tp)
    assert counts == [predicted] * tp


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b", "interleaved_1f1b"])
def test_the_micro_batches_held_at_a_backward_are_the_simulated_ones(schedule: str) -> None:
    """held_at_backward walks the schedule's actions: with one byte per layer and nothing else,
    its peak on each stage is the simulation's peak of chunks in flight times a chunk's layers."""
    for p in (2, 3, 4):
        for m in (1, 2, 4, 8):
            if schedule == "interleaved_1f1b" and m % p:
                continue
            c = Candidate(1, p, 1, 1, m, schedule=schedule, virtual_stages=2)
            config = base_config()
            model = replace(config.model, num_layers=p * c.chunks * 2)
            work = Workload.of(replace(config, model=model), m)
            split = c.split(work)
            peak = simulate(schedule, p, m, c.chunks).peak_in_flight
            held = [held_at_backward(work, c, r, 1.0, 0.0, 0.0, 0.0) for r in range(p)]
            assert held == [n * split[r] for r, n in enumerate(peak)], (schedule, p, m)


def _lines(**trainer: int) -> tuple[list[str], list[str]]:
    config = base_config()
    config = replace(config, trainer=replace(config.trainer, **trainer))
    cluster = resolve_cluster(load_preset("cpu"), "fp32", cache_dir="/nonexistent")
    return prediction_lines(
        config, Layout(1, 1), cluster, "cpu", predict_memory_of(config, Layout(1, 1), cluster)
    )


def test_startup_plan_warns_about_a_much_slower_layout() -> None:
    lines, warnings = _lines(micro_batch_size=1, grad_accum=16)
    assert any(line.startswith("step time (predicted on cluster cpu)") for line in lines)
    assert len(warnings) == 1 and "slower than the best that fits" in warnings[0], warnings
    assert "trainer.micro_batch_size=" in warnings[0]
    _, none = _lines(micro_batch_size=16, grad_accum=1)
    assert none == []


def test_startup_plan_warns_when_the_layout_does_not_fit() -> None:
    config = base_config()
    config = replace(config, trainer=replace(config.trainer, micro_batch_size=16, grad_accum=1))
    cluster = resolve_cluster(
        replace(load_preset("cpu"), device_memory_gb=0.01), "fp32", cache_dir="/nonexistent"
    )
    _, warnings = prediction_lines(
        config, Layout(1, 1), cluster, "cpu", predict_memory_of(config, Layout(1, 1), cluster)
    )
    assert any("predicted to run out of memory" in w and "> 10 MB" in w for w in warnings), warnings


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b", "interleaved_1f1b"])
def test_pipeline_makespan_is_the_simulated_one(schedule: str) -> None:
    """Equal stages: the closed form the search uses is what replaying the schedule gives."""
    for p in (1, 2, 3, 4):
        for m in (1, 2, 4, 8, 12):
            v = 2 if schedule == "interleaved_1f1b" else 1
            if v > 1 and m % p:
                continue
            # simulate: forward 1 and backward 2 per virtual stage -> a stage's step 3v
            want = simulate(schedule, p, m, v).makespan
            assert pipeline_makespan([3.0 * v] * p, m, v) == pytest.approx(want), (p, m)


def test_calibrated_collectives_replace_the_link_constants() -> None:
    """A collective calibration measured is priced with its own constants, the others with the
    link's (ring model at n = 2: all-reduce bytes/bw + 2 lat, all-gather bytes/2/bw + lat)."""
    link = Link(1e9, 1e-4, (("all_gather", 4e9, 0.0),))
    assert link.all_gather(8e9, 2) == pytest.approx(1.0)
    assert link.reduce_scatter(8e9, 2) == pytest.approx(4.0 + 1e-4)
    assert link.all_reduce(8e9, 2) == pytest.approx(8.0 + 2e-4)


def test_calibration_fit_survives_times_that_do_not_grow() -> None:
    """A busy machine can time a larger message faster: the fit still gives a positive
    bandwidth (the best size/time seen) instead of a negative one the planner would divide by."""
    from tpformer.planner.calibrate import _fit

    bandwidth, intercept = _fit([(1e6, 2e-3), (2e6, 1e-3), (4e6, 1.5e-3)])
    assert bandwidth == pytest.approx(4e6 / 1.5e-3) and intercept == 0.0
    bandwidth, intercept = _fit([(1e6, 1e-3 + 1e-5), (2e6, 2e-3 + 1e-5), (4e6, 4e-3 + 1e-5)])
    assert bandwidth == pytest.approx(1e9) and intercept == pytest.approx(1e-5)


@pytest.mark.slow  # over 5 s (the quick tier leaves single cases that long to the full run)
def test_the_peak_stage_is_found_without_pricing_every_stage() -> None:
    """predict_memory prices the first, the last and the first middle stage of each layer
    count; on every pipelined layout of a search it equals the scan of all stages."""
    from tpformer.config.presets import preset
    from tpformer.planner.candidate import enumerate_candidates
    from tpformer.planner.memory import predict_memory, predict_stage_memory

    work = Workload(preset("bert_large"), 512, 512, "bf16", 0.15)
    config = replace(load_preset("h100_node"), nodes=8, calibration="none")
    cluster = resolve_cluster(config, "bf16", cache_dir="")
    checked = 0
    for c in enumerate_candidates(work, cluster.world_size, cluster.gpus_per_node):
        if c.pp < 3 or c.recompute != "none":
            continue
        full = max(predict_stage_memory(work, c, cluster), key=lambda m: m.total)
        assert predict_memory(work, c, cluster) == full, c
        checked += 1
    assert checked > 100


def test_the_pipeline_split_is_optimal_and_even() -> None:
    """Against every split of up to 9 layers: no split has a faster slowest stage, and among
    those as fast none is more even."""
    import itertools
    import random

    from tpformer.planner.partition import StageCosts, best_split

    rng = random.Random(0)
    for _ in range(200):
        n = rng.randint(1, 9)
        costs = StageCosts(
            [rng.choice([1.0, 2.0, rng.random()]) for _ in range(n)],
            rng.random(),
            rng.random(),
            rng.choice([0.0, 0.1]),
        )
        stages = rng.randint(1, n)
        got = best_split(costs, stages)
        assert sum(got) == n and len(got) == stages and min(got) >= 1
        slowest = round(max(costs.of_split(got)), 9)
        for cuts in itertools.combinations(range(1, n), stages - 1):
            split = [b - a for a, b in itertools.pairwise((0, *cuts, n))]
            other = round(max(costs.of_split(split)), 9)
            assert other >= slowest, (costs, stages, got, split)


def test_fast_rng_is_priced_as_the_fused_attention_kernel() -> None:
    """bert_large, seq 512, bf16 on h100_node: under parallel.rng=fast (auto on a GPU) a layer
    keeps no [b, h, s, s] tensors (the 5as/h term of Korthikanti's sbh(34 + 5as/h): 40 of 74
    units here) and draws no per-sample streams; exact keeps today's costs; on the cpu preset
    auto stays exact and nothing changes."""
    from tpformer.config.presets import preset
    from tpformer.planner.memory import activation_parts, fused_attention, predict_memory
    from tpformer.planner.step_time import predict_time

    model = preset("bert_large")
    gpu = resolve_cluster(
        replace(load_preset("h100_node"), calibration="none"), "bf16", cache_dir=""
    )
    c = Candidate(tp=1, pp=1, dp=8, micro_batch=32, grad_accum=1, zero_stage=1)
    work = {rng: Workload(model, 512, 256, "bf16", 0.15, rng=rng) for rng in ("exact", "fast")}
    assert not fused_attention(work["exact"], gpu) and fused_attention(work["fast"], gpu)
    assert fused_attention(Workload(model, 512, 256, "bf16", 0.15), gpu)  # auto on a GPU
    layer = {r: activation_parts(work[r], c, fused=fused_attention(work[r], gpu))[0] for r in work}
    sbh = 512 * 32 * 1024
    assert layer["exact"] - layer["fast"] == (2 * 2 + 1) * 16 * 512 * 512 * 32  # (2i + mask) as^2b
    assert layer["exact"] / sbh == pytest.approx(34 + 40) and layer["fast"] / sbh == 34
    memory = {r: predict_memory(work[r], c, gpu).total for r in work}
    time = {r: predict_time(work[r], c, gpu).step for r in work}
    assert memory["fast"] < 0.6 * memory["exact"] and time["fast"] < 0.8 * time["exact"]
    cpu = resolve_cluster(load_preset("cpu"), "fp32", cache_dir="/nonexistent")
    auto = Workload(model, 128, 8, "fp32", 0.15)
    assert not fused_attention(auto, cpu)
    assert predict_memory(auto, c, cpu) == predict_memory(replace(auto, rng="exact"), c, cpu)


def test_cluster_presets_load_as_hydra_composes_them() -> None:
    """load_preset reads the YAML with PyYAML (the GPU image has no OmegaConf): every preset
    gives the ClusterConfig that OmegaConf's typed merge gives."""
    from omegaconf import OmegaConf

    from tpformer.config.schema import ClusterConfig
    from tpformer.config.store import CONF_DIR
    from tpformer.planner.cluster import load_preset

    presets = sorted((Path(CONF_DIR) / "cluster").glob("*.yaml"))
    assert len(presets) >= 4
    for path in presets:
        typed = OmegaConf.merge(OmegaConf.structured(ClusterConfig), OmegaConf.load(path))
        assert load_preset(path.stem) == OmegaConf.to_object(typed), path.stem


def test_a_local_layer_is_priced_its_band_unless_flash_runs_the_window() -> None:
    """The planner's local_attention_bytes follows the core's rule (flash_runs_the_window): on
    an accelerator an unpadded bf16 encoder keeps no band; a padded batch keeps its [b, 1, s,
    s] bias, and a decoder (whose window flash's symmetric one is not) its [s, s] band."""
    from tpformer.config.schema import LocalAttentionConfig
    from tpformer.planner.memory import local_attention_bytes

    local = LocalAttentionConfig(window=16, global_every=3)
    encoder = replace(tiny_bert(0.0), local_attention=local)
    decoder = replace(tiny_gpt(0.0), local_attention=local)
    c = Candidate(1, 1, 1, 2, 1)
    s = 64

    def held(model: ModelConfig, padded: bool) -> float:
        work = Workload(model, s, 2, "bf16", 0.15, "none", padded=padded)
        return local_attention_bytes(work, c, fused=True)

    assert held(encoder, padded=False) == 0
    assert held(encoder, padded=True) == 2 * s * s * 2  # micro-batch 2, bf16
    assert held(decoder, padded=False) == s * s * 2
