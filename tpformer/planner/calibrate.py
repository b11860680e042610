"""`tpformer-plan --calibrate`: measure this machine's constants for the planner, one device
(on CPU: one core, the thread count each rank runs with) at a time: matmul throughput by size
and dtype, memory bandwidth, each collective's bandwidth and latency between two local ranks,
and one real layer's forward+backward time and saved activations (which fix the elementwise cost and
the activation formula's scale)."""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import torch
import torch.multiprocessing as mp

from tpformer.config.presets import preset
from tpformer.engine.memory import measure_saved_activations
from tpformer.layers.dropout import dropout_mask_bytes
from tpformer.models import build_model
from tpformer.parallel.context import ParallelContext
from tpformer.parallel.link_timing import time_collectives
from tpformer.planner.candidate import Candidate, Workload
from tpformer.planner.cluster import GB, Cluster
from tpformer.planner.layer_memory import layer_activation_bytes
from tpformer.planner.step_time import gemms_time, layer_gemms

COLLECTIVE_BYTES = (2**12, 2**16, 2**20, 2**22, 2**24)


def _timed(fn: Callable[[], object], device: torch.device, min_time: float = 0.2) -> float:
    """Median seconds of fn() over enough repeats to fill min_time (after one warm-up)."""

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize()

    fn()
    sync()
    times: list[float] = []
    while sum(times) < min_time or len(times) < 3:
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def matmul_tflops(dtype: torch.dtype, device: torch.device, sizes: list[int]) -> list[list[float]]:
    """[size, TFLOP/s] of n x n @ n x n matmuls."""
    out = []
    for n in sizes:
        a = torch.randn(n, n, device=device, dtype=dtype)
        b = torch.randn(n, n, device=device, dtype=dtype)
        out.append([n, 2 * n**3 / _timed(lambda: a @ b, device) / 1e12])  # noqa: B023 - timed now
    return out


def memory_gbps(device: torch.device) -> float:
    """Copy bandwidth (bytes read + written) of a buffer well beyond the caches."""
    n = (256 if device.type == "cuda" else 32) * 2**20
    src = torch.ones(n // 4, device=device)
    dst = torch.empty_like(src)
    return 2 * n / _timed(lambda: dst.copy_(src), device) / GB


def _fit(points: list[tuple[float, float]]) -> tuple[float, float]:
    """Least squares t = a + x / bw over (x, t): (bandwidth, a). Timing noise on a busy machine
    can make the times not grow with x; then the bandwidth is the best x / t seen, with no
    intercept, so the planner never divides by a non-positive bandwidth."""
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(t for _, t in points) / n
    slope = sum((x - mx) * (t - my) for x, t in points) / sum((x - mx) ** 2 for x, _ in points)
    if slope <= 0:
        return max(x / t for x, t in points), 0.0
    return 1 / slope, max(0.0, my - slope * mx)


COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "send")
RING_SHARE = {"all_reduce": 1.0, "all_gather": 0.5, "reduce_scatter": 0.5, "send": 1.0}
"""At n = 2 the ring model is t = share x bytes / bandwidth + k x latency (k = 2 for the
all-reduce's two phases, else 1)."""


def collective_constants() -> dict[str, tuple[float, float]]:
    """op -> (bandwidth GB/s, latency us) between two local ranks, each fitted to the ring
    model of Link at n = 2."""
    with tempfile.TemporaryDirectory() as tmp:
        out = f"{tmp}/times.json"
        mp.start_processes(
            time_collectives,
            args=(f"{tmp}/store", out, COLLECTIVES, COLLECTIVE_BYTES),
            nprocs=2,
            start_method="spawn",
        )
        points = json.loads(Path(out).read_text())
    constants = {}
    for op, samples in points.items():
        bandwidth, intercept = _fit([(RING_SHARE[op] * n, t) for n, t in samples])
        constants[op] = (bandwidth / GB, intercept / (2 if op == "all_reduce" else 1) * 1e6)
    return constants


MIN_ELEMENTWISE_PASSES = 1.0


def layer_constants(cluster: Cluster, device: torch.device, precision: str) -> dict[str, float]:
    """The layer terms, from one bert_small layer at seq 128, batch 8 (forward+backward):
    `layer_overhead_us` its time on 8 tokens; `dropout_ns` the time dropout 0.1 adds, per
    noise element drawn; `elementwise_passes` the dropout-free time minus the overhead and the
    predicted matmul time, per byte the layer saves (at least one pass: a layer writes what it
    saves, and on a busy machine the matmul prediction can exceed the measured time);
    `activation_scale` its saved activations measured / the formula's."""
    dtype = torch.float32 if precision == "fp32" else torch.bfloat16
    s, b = 128, 8

    def block_of(p: float) -> torch.nn.Module:
        config = preset("bert_small", dropout=p, attention_dropout=p)
        model = build_model(config, ParallelContext.single(device=device.type), task="pretraining")
        return model.to(device=device, dtype=dtype).train().blocks()[0]

    config = preset("bert_small")
    h = config.hidden_size
    x = torch.randn(b, s, h, device=device, dtype=dtype, requires_grad=True)
    small = torch.randn(1, 8, h, device=device, dtype=dtype, requires_grad=True)
    block, plain = block_of(0.1), block_of(0.0)
    with_dropout = _timed(lambda: block(x, None).sum().backward(), device, min_time=0.5)
    without = _timed(lambda: plain(x, None).sum().backward(), device, min_time=0.5)
    overhead = _timed(lambda: plain(small, None).sum().backward(), device)
    work = Workload(config, s, b, precision, 0.15)
    matmuls = sum(gemms_time(cluster, layer_gemms(work, Candidate(1, 1, 1, b, 1)), work.itemsize))
    saves = layer_activation_bytes(
        s,
        b,
        h,
        config.num_heads,
        config.intermediate_size,
        tp=1,
        sequence_parallel=False,
        recompute="none",
        itemsize=work.itemsize,
        mask_bytes=dropout_mask_bytes(device.type, dtype),
    )
    noise = config.num_heads * s * s * b + 2 * s * b * h
    saved = measure_saved_activations(block, lambda: block(x, None).sum())
    elementwise_s = without - overhead - matmuls
    return {
        "layer_overhead_us": overhead * 1e6,
        "dropout_ns": max(0.0, with_dropout - without) / noise * 1e9,
        "elementwise_passes": max(
            MIN_ELEMENTWISE_PASSES, elementwise_s * cluster.memory_bandwidth / saves
        ),
        "activation_scale": saved.total / saves,
    }


def calibrate(cluster: Cluster, precision: str, device: torch.device, *, collectives: bool) -> dict:
    """Every constant measured here, as the keys of the cluster config they replace."""
    threads = torch.get_num_threads()
    if device.type == "cpu":
        torch.set_num_threads(1)  # one device = one core = one rank's thread
    try:
        sizes = [64, 128, 256, 512, 1024, 2048] + ([4096, 8192] if device.type == "cuda" else [])
        curves = {"fp32": matmul_tflops(torch.float32, device, sizes)}
        if device.type == "cuda" or precision == "bf16":
            curves["16bit"] = matmul_tflops(torch.bfloat16, device, sizes)
        result: dict = {
            "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
            "matmul": curves,
            "memory_gbps": memory_gbps(device),
        }
        if device.type == "cuda":  # the tile model's plateau and SMs, measured here
            best = max(t for _, t in curves["16bit" if precision != "fp32" else "fp32"])
            result["matmul_efficiency"] = min(1.0, best * 1e12 / cluster.peak_flops)
            result["sm_count"] = torch.cuda.get_device_properties(0).multi_processor_count
        if device.type == "cpu":  # a core has no datasheet peak: the best measured matmul
            result["peak_tflops_fp32"] = max(t for _, t in curves["fp32"])
            if "16bit" in curves:
                result["peak_tflops_16bit"] = max(t for _, t in curves["16bit"])
        measured = replace(
            cluster,
            memory_bandwidth=result["memory_gbps"] * GB,
            peak_flops=1e12
            * result.get(
                "peak_tflops_16bit" if precision != "fp32" else "peak_tflops_fp32",
                cluster.peak_flops / 1e12,
            ),
        )
        curve = curves["16bit" if precision != "fp32" and "16bit" in curves else "fp32"]
        measured = replace(
            measured, matmul_curve=tuple((int(s), t * 1e12 / measured.peak_flops) for s, t in curve)
        )
        result.update(layer_constants(measured, device, precision))
        if collectives:
            links = collective_constants()
            result["collectives"] = links
            result["intra_node_gbps"], result["intra_node_latency_us"] = links["all_reduce"]
        return result
    finally:
        torch.set_num_threads(threads)
