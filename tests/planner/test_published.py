"""The planner against published GPU runs (Narayanan et al. 2021, Tables 1 and 2; Korthikanti et
al. 2022, Tables 4 and 5; priced with the options those runs had), and the pieces that make it:
GEMMs priced by shape, engine profiles, offload on the host."""

from __future__ import annotations

import math
import sys
from dataclasses import replace

import pytest

from tests.train.test_trainer import REPO

sys.path.insert(0, str(REPO / "tools"))

from published_runs import (  # tools/published_runs.py: a reference, not the package
    KORTHIKANTI_TABLE_4,
    KORTHIKANTI_TABLE_5,
    MEGATRON_TABLE_1,
    MEGATRON_TABLE_2,
    TABLE_4_RUN,
    ZERO_TABLE_1,
    cluster,
    megatron_matmul_efficiency,
    paper_flops,
    reproduce,
    stated_layout,
    table_4_layer,
    workload,
)

from tests.models.common import tiny_gpt
from tpformer.engine.memory import zero_memory_bytes
from tpformer.planner.candidate import Candidate, Workload
from tpformer.planner.cluster import load_preset, resolve_cluster
from tpformer.planner.memory import held_at_backward, predict_stage_memory
from tpformer.planner.search import MODEL_ERROR, PlanResult, evaluate, why_not
from tpformer.planner.step_time import predict_time

A100_PEAK, A100_MAMF = 312e12, 0.869


def a100():
    return resolve_cluster(
        replace(load_preset("a100_node"), calibration="none"), "bf16", cache_dir="/nonexistent"
    )


def test_large_gemms_run_at_the_measured_plateau() -> None:
    cl = a100()
    m = 128 * 256 * 108  # whole tiles filling whole waves
    t = cl.gemm_time(m, 8192, 8192)
    assert t == pytest.approx(2 * m * 8192 * 8192 / (A100_PEAK * A100_MAMF), rel=1e-9)


def test_a_partial_wave_costs_more_than_its_flops() -> None:
    cl = a100()
    full = cl.gemm_time(256 * 108, 256, 4096)  # whole waves of every tile shape
    spill = cl.gemm_time(256 * 109, 256, 4096)  # 0.9% more rows: a partial wave
    assert full == pytest.approx(2 * 256 * 108 * 256 * 4096 / (A100_PEAK * A100_MAMF))
    assert spill > 1.2 * full


def test_thin_gemms_are_bound_by_memory() -> None:
    cl = a100()
    m, n, k = 65536, 4096, 16  # 2 FLOPs per byte read or written, far below the A100's ~150
    assert cl.gemm_time(m, n, k) == pytest.approx(2 * (m * k + k * n + m * n) / cl.memory_bandwidth)


def test_small_per_rank_gemms_cost_more_per_flop() -> None:
    """TP=8 at micro-batch 1 (the issue's case) gets less of the peak than TP=1 at micro 8."""
    cl = a100()
    h, tokens = 2304, 2048

    def rate(m: int, n: int, k: int) -> float:
        return 2 * m * n * k / cl.gemm_time(m, n, k) / A100_PEAK

    assert rate(tokens, 4 * h // 8, h) < 0.8 * rate(8 * tokens, 4 * h, h)


def test_the_cpu_preset_keeps_its_size_curve() -> None:
    cl = resolve_cluster(load_preset("cpu"), "fp32", cache_dir="/nonexistent")
    assert cl.sm_count == 0
    assert cl.gemm_time(64, 64, 64) == pytest.approx(
        2 * 64**3 / (cl.peak_flops * cl.matmul_efficiency(64))
    )


def test_sixteen_bit_gradients_give_the_zero_papers_sixteen_bytes() -> None:
    mixed = zero_memory_bytes(0, 1000, 1, param_bytes=2, mixed=True, grad_bytes=2)
    assert mixed.total == 16 * 1000
    assert zero_memory_bytes(0, 1000, 1, param_bytes=2, mixed=True).total == 18 * 1000


def test_offload_is_charged_on_the_host_and_checked_against_its_ram() -> None:
    cl = a100()
    work = Workload(tiny_gpt(), 64, 8, "bf16", 1.0, nsp=False)
    c = Candidate(1, 1, 8, 1, 1, zero_stage=2, cpu_offload="optimizer")
    slow_host = replace(cl, host_step_bandwidth=cl.host_step_bandwidth / 10)
    assert predict_time(work, c, slow_host).optimizer > predict_time(work, c, cl).optimizer
    fits = evaluate(work, c, cl)
    assert fits.fits and fits.memory.host > 0
    small = replace(cl, host_memory=fits.memory.host * cl.gpus_per_node / 2)
    refused = evaluate(work, c, small)
    assert not refused.fits
    result = PlanResult(work, small, [fits], [fits, refused])
    assert "does not fit the host" in why_not(result, refused)


ONE_T_OUTSIDE = pytest.mark.xfail(
    strict=True,
    reason="a finding: the 1T row's fastest fitting layout (interleaved 1F1B, micro 1, 68 GB "
    "once sent stage outputs are freed) is predicted 1.105x the published throughput, outside "
    "MODEL_ERROR",
)


@pytest.mark.parametrize(
    "run",
    [
        pytest.param(run, marks=ONE_T_OUTSIDE) if run.params_b == 1008.0 else run
        for run in MEGATRON_TABLE_1
    ],
    ids=lambda r: f"{r.params_b:g}B",
)
def test_megatron_weak_scaling_within_the_model_error(run) -> None:
    """Table 1 at the 2021 options: every run fits, throughput within MODEL_ERROR (measured
    0.955-1.091 on nine rows). Table 1 states neither micro-batch nor schedule: each row is
    priced at the fastest layout at its split that fits, an upper bound. The 1T row is not held:
    its interleaved schedule fits again now that a stage frees its sent outputs (as Megatron
    does), at 1.105 (with the outputs kept it did not fit, and 1F1B gave 1.061)."""
    r = reproduce(run)
    assert r.published.fits, run
    assert abs(math.log(r.ratio)) <= math.log(1 + MODEL_ERROR), (run, r.ratio)


@pytest.mark.slow  # over 5 s (the quick tier leaves single cases that long to the full run)
def test_megatron_first_choices_two_sided() -> None:
    """The planner's first choice against Table 1's published split, counted both ways (a
    published split predicted faster than the first choice is a disagreement too): the first
    choice is the published split on 4 of the 10 rows and predicts it within 5% either way on
    6. The other four are within the model's 10% tie, where the rule picks the simplest layout
    (fewer pipeline stages) over a faster one: 39.1B (the published TP=8 x PP=2 predicted 9.0%
    slower than TP=4 x PP=4), 145.6B, 310.1B and 1T (the published deeper pipelines predicted
    8.1%, 5.9% and 8.9% faster than the chosen PP=6, 10 and 48)."""
    results = {r.run.params_b: r for r in map(reproduce, MEGATRON_TABLE_1)}
    assert {b for b, r in results.items() if r.first_is_published} == {3.6, 7.5, 18.4, 76.1}
    close = {b for b, r in results.items() if abs(r.margin) <= 0.05}
    assert close == {1.7, 3.6, 7.5, 18.4, 76.1, 529.6}
    assert all(abs(r.margin) <= MODEL_ERROR for r in results.values())


def test_the_2022_stack_is_fitted_to_one_layer_and_predicts_the_other_four() -> None:
    """Korthikanti et al. Table 4: the GEMM plateau is fitted to the baseline layer (19.6 ms),
    which it then reproduces; the four other options (sequence parallelism, full and selective
    recomputation, both) are predictions, within 5% (measured 0.98-1.02)."""
    efficiency = megatron_matmul_efficiency()
    assert 0.6 < efficiency < A100_MAMF  # the older stack reached less than today's plateau
    cl = cluster(TABLE_4_RUN)
    baseline, *others = KORTHIKANTI_TABLE_4
    assert table_4_layer(baseline, cl) * 1e3 == pytest.approx(baseline.ms, rel=1e-3)
    for timing in others:
        assert table_4_layer(timing, cl) * 1e3 == pytest.approx(timing.ms, rel=0.05), timing


@pytest.mark.parametrize("run", KORTHIKANTI_TABLE_5, ids=lambda r: f"{r.params_b:g}B-{r.scheme}")
def test_korthikanti_iterations_fit_and_are_within_the_model_error(run) -> None:
    """Table 5 at Table 3's layouts, full recomputation and SP + selective: every run fits
    80 GB, iteration time within MODEL_ERROR (measured 0.98-1.07), and the first choice with
    the run's options is the published tensor x pipeline split, its predicted time within 5%
    either way of the published layout's (micro-batch and schedule may differ: 1T, 4.2%)."""
    r = reproduce(run)
    assert r.published.fits, run
    assert r.published.candidate.schedule == run.schedule
    assert abs(math.log(r.ratio)) <= math.log(1 + MODEL_ERROR), (run, r.ratio)
    assert r.first_is_published and abs(r.margin) <= 0.05, (run, r.first.candidate, r.margin)


@pytest.mark.slow  # over 5 s (the quick tier leaves single cases that long to the full run)
def test_zero3_and_ptdp_runs_fit_and_keep_their_order() -> None:
    """Table 2: every run fits (the 530B ZeRO-3 run on 640 GPUs included, under DeepSpeed's
    16-bit bucketed gradients); throughput within 20% on every row (measured 0.87-1.16), and
    PTD-P ahead of ZeRO-3 where the paper measured it ahead by more than the model's error
    (768 and 1,536 GPUs: 1.7x and 3.2x)."""
    reproduced = {
        (r.run.scheme, r.run.params_b, r.run.gpus): r for r in map(reproduce, MEGATRON_TABLE_2)
    }
    for r in reproduced.values():
        assert r.published.fits, r.run
        assert abs(math.log(r.ratio)) <= math.log(1.2), (r.run, r.ratio)
    for (scheme, params, gpus), r in reproduced.items():
        ptdp = reproduced.get(("ptd-p", params, gpus))
        if scheme == "zero-3" and ptdp and ptdp.run.tflops > (1 + MODEL_ERROR) * r.run.tflops:
            assert ptdp.published.time.step < r.published.time.step  # type: ignore[operator]


def test_the_first_stage_holds_korthikantis_activations() -> None:
    """Korthikanti et al. Eq. 6 with their interleaving factor: under SP + selective the first
    stage holds 34 s b h L / t (1 + (p - 1) / (p m)) bytes; the planner gives that within 4% at
    every Table 3 layout (the rest is the embedding and head outputs: 0.3% at 175B, 3.3% at 22B,
    whose one stage holds the fp32 logits) once the outputs tpformer's stages keep for their
    backward are left out: Megatron frees them once sent (its deallocate_output_tensor), and so
    does tpformer on an accelerator (parallel/pipeline/runner.release_output), so the planner
    prices none; what is left beside the layers is the gradient received."""
    for run in KORTHIKANTI_TABLE_5:
        if run.scheme != "sp-selective":
            continue
        c = stated_layout(run)
        chunks = c.chunks
        factor = 1 + (run.pp - 1) / (run.pp * chunks) if chunks > 1 else 1.0
        formula = 34 * 2048 * run.micro_batch * run.hidden * run.layers / run.tp * factor
        work = workload(run)
        first = predict_stage_memory(work, c, cluster(run), [0])[0]
        chunk = 2048 * run.micro_batch * run.hidden * work.itemsize / run.tp  # SP: a chunk
        kept = (
            held_at_backward(work, c, 0, 0.0, 0.0, 0.0, chunk, outputs_freed=True)
            if run.pp > 1
            else 0.0
        )
        megatron = first.activations - kept
        assert formula <= megatron <= 1.04 * formula, (run, megatron / formula)
        assert kept <= 0.08 * first.activations, (run, kept / first.activations)


@pytest.mark.parametrize("params", list(ZERO_TABLE_1), ids=lambda p: f"{p / 1e9:g}B")
def test_model_states_match_the_zero_papers_table(params: float) -> None:
    """The ZeRO paper's Table 1 (GB per device, stages 1-3, DP 1-1024) under its 16-bit
    gradients, to its rounding; tpformer's engine keeps fp32 gradients: 2 bytes per parameter
    more where they are not sharded (stage 1: 18 vs 16 at DP 1)."""
    for dp, per_stage in ZERO_TABLE_1[params].items():
        for stage, paper_gb in enumerate(per_stage, start=1):
            state = zero_memory_bytes(
                stage, int(params), dp, param_bytes=2, mixed=True, grad_bytes=2
            )
            assert state.total / 1e9 == pytest.approx(paper_gb, rel=5e-3, abs=5e-3), (dp, stage)
            ours = zero_memory_bytes(stage, int(params), dp, param_bytes=2, mixed=True)
            grads_whole = stage < 2
            extra = 2 * params / (1 if grads_whole else dp)
            assert ours.total - state.total == pytest.approx(extra, abs=2)


@pytest.mark.parametrize("run", MEGATRON_TABLE_1, ids=lambda r: f"{r.params_b}B")
def test_the_paper_flop_count_is_the_one_cost_model_with_recomputation(run) -> None:  # type: ignore[no-untyped-def]
    """Narayanan et al. 2021, eq. 3, closed form, equals models/costs.step_flops with every
    layer's forward recomputed (their runs' full recomputation)."""
    work = workload(run)
    m, s, b = work.model, work.seq, work.global_batch
    h, layers, v = m.hidden_size, m.num_layers, m.vocab_size
    closed = 96 * b * s * layers * h * h * (1 + s / (6 * h) + v / (16 * layers * h))
    assert math.isclose(paper_flops(work), closed, rel_tol=1e-12)


STATED_RANGES = {  # (table, fitted plateau): predicted / published throughput, docs/planner.md
    ("table 1", True): (0.955, 1.105),
    ("table 1", False): (1.011, 1.212),
    ("table 2 ptdp", True): (1.062, 1.087),
    ("table 2 ptdp", False): (1.149, 1.190),
    ("table 2 zero-3", True): (0.866, 1.148),
    ("table 2 zero-3", False): (0.873, 1.163),
    ("table 5", True): (0.983, 1.066),
    ("table 5", False): (1.078, 1.133),
}


@pytest.mark.slow
@pytest.mark.parametrize("fitted", [True, False])
def test_the_fitted_plateau_s_share_of_the_agreement(fitted: bool) -> None:
    """The error per table with the GEMM plateau fitted to Table 4's baseline layer and with
    today's measured one, as docs/planner.md states them (to the third decimal)."""
    tables = {
        "table 1": MEGATRON_TABLE_1,
        "table 2 ptdp": [r for r in MEGATRON_TABLE_2 if r.scheme != "zero-3"],
        "table 2 zero-3": [r for r in MEGATRON_TABLE_2 if r.scheme == "zero-3"],
        "table 5": KORTHIKANTI_TABLE_5,
    }
    for name, runs in tables.items():
        ratios = [reproduce(run, fitted=fitted).ratio for run in runs]
        low, high = STATED_RANGES[(name, fitted)]
        assert (round(min(ratios), 3), round(max(ratios), 3)) == (low, high), name
