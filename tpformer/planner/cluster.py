"""A cluster description resolved to numbers: presets, this machine's devices, and the
constants `tpformer-plan --calibrate` measured (which replace the preset's where present)."""

from __future__ import annotations

import bisect
import json
import math
import os
import typing
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

import torch
import yaml  # type: ignore[import-untyped]  # PyYAML ships no stubs

from tpformer.config import CONF_DIR
from tpformer.config.schema import ClusterConfig
from tpformer.layers.dropout import dropout_mask_bytes

GPU_PRESETS = {"H100": "h100_node", "H200": "h100_node", "A100": "a100_node"}
"""Device name fragment -> the preset whose constants `cluster=auto` uses on that device."""

GB = 1e9

GEMM_TILES = ((256, 128), (128, 256), (128, 128))
"""Output tiles (rows, columns) of cuBLAS's large tensor-core GEMM kernels, the ones that run at
the large-GEMM efficiency (NVIDIA, Matrix Multiplication Background User's Guide, "Typical Tile
Dimensions in cuBLAS and Performance")."""


@dataclass(frozen=True)
class Link:
    """Bandwidth (bytes/s per device) and latency (s) of one kind of link, priced with ring
    algorithms; `measured` holds per-collective constants calibration fitted (op, bandwidth,
    latency), which replace the link's own for that collective."""

    bandwidth: float
    latency: float
    measured: tuple[tuple[str, float, float], ...] = ()

    def _constants(self, op: str) -> tuple[float, float]:
        return next(
            ((bw, lat) for name, bw, lat in self.measured if name == op),
            (self.bandwidth, self.latency),
        )

    def all_reduce(self, nbytes: float, n: int) -> float:
        bw, lat = self._constants("all_reduce")
        return 0.0 if n == 1 else 2 * (n - 1) * (nbytes / n / bw + lat)

    def all_gather(self, nbytes: float, n: int) -> float:
        """`nbytes` = the gathered (whole) size."""
        bw, lat = self._constants("all_gather")
        return 0.0 if n == 1 else (n - 1) * (nbytes / n / bw + lat)

    def reduce_scatter(self, nbytes: float, n: int) -> float:
        """`nbytes` = the whole input."""
        bw, lat = self._constants("reduce_scatter")
        return 0.0 if n == 1 else (n - 1) * (nbytes / n / bw + lat)

    def send(self, nbytes: float) -> float:
        bw, lat = self._constants("send")
        return nbytes / bw + lat


@dataclass(frozen=True)
class Cluster:
    """Every constant of the time and memory model, in SI units, for one precision."""

    name: str
    gpus_per_node: int
    nodes: int
    device_memory: float
    """bytes"""
    peak_flops: float
    """FLOP/s of one device in the run's precision."""
    matmul_curve: tuple[tuple[int, float], ...]
    """(smallest matrix dimension, fraction of peak) measured, or ((1, matmul_efficiency),):
    the efficiency of a GEMM by its size alone, used where `sm_count` is 0 (CPU)."""
    memory_bandwidth: float
    elementwise_passes: float
    layer_overhead: float
    """seconds per layer per micro-batch (forward + backward)"""
    dropout_time: float
    """seconds per element of dropout noise"""
    intra: Link
    inter: Link
    host_bandwidth: float
    comm_overlap: float
    overhead: float
    """bytes"""
    activation_scale: float = 1.0
    """Measured / formula saved activations of one layer (calibrated), applied to predictions."""
    mask_bytes: int = 1
    """Bytes per element of a saved dropout mask: 4 on the cpu preset in fp32 (float masks),
    else 1 (layers.dropout.dropout_mask_bytes)."""
    calibrated: str = ""
    """The calibration file applied, if any."""
    device_type: str = "cuda"
    """cpu for the cpu preset, else cuda: what parallel.rng=auto resolves against."""
    sm_count: int = 0
    """Streaming multiprocessors: > 0 prices each GEMM by its output tiles and waves (see
    gemm_time); 0 by the size curve."""
    host_memory: float = 0.0
    """bytes of host RAM per node for offloaded state (0: not checked)."""
    host_step_bandwidth: float = 0.0
    """bytes/s of host memory one device's offloaded optimizer step gets (0: host_bandwidth)."""
    fp8_speedup: float = 1.0
    """The fp8 peak over the 16-bit one under parallel.precision=fp8 (1: none known), by which
    the blocks' linear matmuls are faster."""

    @property
    def world_size(self) -> int:
        return self.gpus_per_node * self.nodes

    def matmul_efficiency(self, dim: float) -> float:
        """Fraction of peak a matmul whose smallest dimension is `dim` reaches (log-linear
        between measured sizes, flat beyond them)."""
        sizes = [s for s, _ in self.matmul_curve]
        i = bisect.bisect_left(sizes, dim)
        if i == 0:
            return self.matmul_curve[0][1] * min(1.0, dim / sizes[0])
        if i == len(sizes):
            return self.matmul_curve[-1][1]
        (s0, e0), (s1, e1) = self.matmul_curve[i - 1], self.matmul_curve[i]
        w = math.log(dim / s0) / math.log(s1 / s0)
        return e0 + w * (e1 - e0)

    def gemm_time(self, m: float, n: float, k: float, batch: float = 1, itemsize: int = 2) -> float:
        """Seconds of `batch` GEMMs [m, k] @ [k, n].

        On a GPU preset (sm_count > 0), as NVIDIA's Matrix Multiplication Background guide
        describes cuBLAS: the output is cut into tiles (the best of GEMM_TILES), each SM computes
        one tile at a time at the large-GEMM efficiency, so the time is whole waves of sm_count
        tiles (tile and wave quantization), and never less than reading both inputs and writing
        the output at memory bandwidth (the math/memory bound). Without SMs (CPU): FLOPs at the
        efficiency of the smallest dimension, as measured by calibration."""
        flops = 2 * m * n * k * batch
        if self.sm_count <= 0:
            return flops / (self.peak_flops * self.matmul_efficiency(min(m, n, k)))
        rate = self.peak_flops * self.matmul_curve[-1][1] / self.sm_count  # one SM's FLOP/s
        compute = min(
            math.ceil(batch * math.ceil(m / tm) * math.ceil(n / tn) / self.sm_count)
            * 2
            * tm
            * tn
            * k
            / rate
            for tm, tn in GEMM_TILES
        )
        memory = itemsize * batch * (m * k + k * n + m * n) / self.memory_bandwidth
        return max(compute, memory)

    def gemm_train_time(
        self, m: float, n: float, k: float, batch: float = 1, itemsize: int = 2
    ) -> tuple[float, float]:
        """(forward, backward) seconds of a GEMM [m, k] @ [k, n] in training: backward is the
        input gradient [m, n] @ [n, k] and the weight gradient [k, m] @ [m, n]."""
        return self.gemm_time(m, n, k, batch, itemsize), self.gemm_time(
            m, k, n, batch, itemsize
        ) + self.gemm_time(k, n, m, batch, itemsize)

    def link(self, group_span: int) -> Link:
        """The link a group whose ranks span `group_span` consecutive ranks uses."""
        return self.intra if group_span <= self.gpus_per_node else self.inter


def load_preset(name: str) -> ClusterConfig:
    path = Path(CONF_DIR) / "cluster" / f"{name}.yaml"
    if not path.exists():
        valid = sorted(p.stem for p in path.parent.glob("*.yaml"))
        raise ValueError(f"cluster={name}: no such preset; valid presets are {valid}")
    return _typed_cluster(yaml.safe_load(path.read_text()) or {}, path)


def _typed_cluster(values: dict[str, Any], path: Path) -> ClusterConfig:
    """A preset's YAML values as ClusterConfig, each cast to its field's type (PyYAML, which
    transformers brings, reads 1e-3 as a string): the startup report prices a run with the
    preset where Hydra and OmegaConf are not installed (the GPU image)."""
    hints = typing.get_type_hints(ClusterConfig)
    unknown = sorted(set(values) - set(hints))
    if unknown:
        raise ValueError(f"{path}: {unknown} are not cluster keys")
    casts: dict[Any, Any] = {float: float, int: int, str: str}
    return ClusterConfig(**{k: casts.get(hints[k], lambda v: v)(v) for k, v in values.items()})


def device_kind() -> str:
    """The preset this machine's device belongs to: a known GPU's, else cpu."""
    if torch.cuda.is_available():
        name = torch.cuda.get_device_name()
        return next((p for gpu, p in GPU_PRESETS.items() if gpu in name), "h100_node")
    return "cpu"


def _fill_from_device(
    config: ClusterConfig, world_size: int | None, local_world_size: int | None
) -> ClusterConfig:
    """cluster=auto: the preset of this device kind under the values given, plus counts and
    memory read from this launch and device."""
    kind = device_kind()
    base = load_preset(kind)
    given = {
        f.name: getattr(config, f.name)
        for f in fields(config)
        if getattr(config, f.name) not in (0, 0.0) and f.name not in ("name", "calibration")
    }
    filled = replace(base, **given, calibration=config.calibration)
    devices = torch.cuda.device_count() if kind != "cpu" else os.cpu_count() or 1
    local = local_world_size or min(world_size or devices, devices)
    if not config.gpus_per_node:
        filled = replace(filled, gpus_per_node=local)
    if not config.nodes:
        world = world_size or filled.gpus_per_node
        filled = replace(filled, nodes=-(-world // filled.gpus_per_node))
    if not config.device_memory_gb:
        if kind != "cpu":
            memory: float = torch.cuda.get_device_properties(0).total_memory
        else:
            # the host's RAM, less a fifth for the system, shared by the local ranks
            memory = (
                0.8
                * os.sysconf("SC_PAGE_SIZE")
                * os.sysconf("SC_PHYS_PAGES")
                / filled.gpus_per_node
            )
        filled = replace(filled, device_memory_gb=memory / GB)
    return filled


def calibration_path(cache_dir: str, name: str) -> Path:
    return Path(os.path.expanduser(cache_dir)) / "calibration" / f"{name}.json"


def _check(config: ClusterConfig) -> None:
    """Every constant the model divides by must be positive; fractions in (0, 1]."""
    required = [
        "gpus_per_node",
        "nodes",
        "device_memory_gb",
        "peak_tflops_fp32",
        "peak_tflops_16bit",
        "matmul_efficiency",
        "memory_gbps",
        "elementwise_passes",
        "intra_node_gbps",
        "inter_node_gbps",
        "host_gbps",
    ]
    bad = [k for k in required if not getattr(config, k) > 0]
    if len(bad) == len(required):  # nothing described: a preset was meant
        presets = sorted(p.stem for p in (Path(CONF_DIR) / "cluster").glob("*.yaml"))
        raise ValueError(
            f"cluster.name={config.name} only labels a cluster and picks no preset: pick one "
            f"with cluster=<{'|'.join(presets)}>, or describe yours with "
            f"{', '.join(f'cluster.{k}' for k in required)}"
        )
    if bad:
        raise ValueError(
            f"cluster={config.name}: {', '.join(f'cluster.{k}={getattr(config, k)}' for k in bad)} "
            "must be > 0 (a device needs memory, compute and links to be planned for)"
        )
    for key in ("matmul_efficiency", "comm_overlap"):
        if not 0 <= getattr(config, key) <= 1:
            raise ValueError(f"cluster.{key}={getattr(config, key)} must be a fraction in [0, 1]")


def _calibration_file(config: ClusterConfig, cache_dir: str) -> Path | None:
    """cluster.calibration's file: auto = the stored one for this cluster if any, none = None."""
    if config.calibration == "auto":
        path = calibration_path(cache_dir, config.name)
        return path if path.exists() else None
    if config.calibration == "none":
        return None
    path = Path(config.calibration)
    if not path.exists():
        raise ValueError(
            f"cluster.calibration={config.calibration}: no such file (run "
            "tpformer-plan --calibrate, or use auto or none)"
        )
    return path


def _read_calibration(path: Path) -> dict:
    try:
        return dict(json.loads(path.read_text()))
    except (OSError, json.JSONDecodeError) as err:
        raise ValueError(
            f"cluster.calibration: cannot read {path}: {err}; re-run tpformer-plan --calibrate"
        ) from err


def _fp8_speedup(config: ClusterConfig, precision: str) -> float:
    """The fp8 peak over the 16-bit one for an fp8 run on a cluster with a known fp8 peak."""
    if precision == "fp8" and config.peak_tflops_fp8 > 0:
        return config.peak_tflops_fp8 / config.peak_tflops_16bit
    return 1.0


def resolve_cluster(
    config: ClusterConfig,
    precision: str,
    *,
    cache_dir: str,
    world_size: int | None = None,
    local_world_size: int | None = None,
) -> Cluster:
    """The numbers of `config` for a run in `precision`: `auto` filled from this machine, the
    stored calibration applied (cluster.calibration), every value checked."""
    if config.name == "auto":
        config = _fill_from_device(config, world_size, local_world_size)
    path = _calibration_file(config, cache_dir)
    calibration = _read_calibration(path) if path is not None else {}
    if calibration:
        known = {f.name for f in fields(config)} - {"name"}
        config = replace(config, **{k: v for k, v in calibration.items() if k in known})
    _check(config)
    bits16 = precision != "fp32"
    peak = (config.peak_tflops_16bit if bits16 else config.peak_tflops_fp32) * 1e12
    curve = calibration.get("matmul", {}).get("16bit" if bits16 else "fp32")
    device_type = "cpu" if config.name == "cpu" else "cuda"
    # a GPU (sm_count > 0) keeps the tile model; calibration measures its plateau instead
    matmul_curve = (
        tuple((int(s), tflops * 1e12 / peak) for s, tflops in curve)
        if curve and not config.sm_count
        else ((1, config.matmul_efficiency),)
    )
    return Cluster(
        name=config.name,
        gpus_per_node=config.gpus_per_node,
        nodes=config.nodes,
        device_memory=config.device_memory_gb * GB,
        peak_flops=peak,
        fp8_speedup=_fp8_speedup(config, precision),
        matmul_curve=matmul_curve,
        memory_bandwidth=config.memory_gbps * GB,
        elementwise_passes=config.elementwise_passes,
        layer_overhead=config.layer_overhead_us * 1e-6,
        dropout_time=config.dropout_ns * 1e-9,
        intra=Link(
            config.intra_node_gbps * GB,
            config.intra_node_latency_us * 1e-6,
            tuple(
                (op, gbps * GB, us * 1e-6)
                for op, (gbps, us) in calibration.get("collectives", {}).items()
            ),
        ),
        inter=Link(config.inter_node_gbps * GB, config.inter_node_latency_us * 1e-6),
        host_bandwidth=config.host_gbps * GB,
        comm_overlap=config.comm_overlap,
        overhead=config.overhead_gb * GB,
        activation_scale=float(calibration.get("activation_scale", 1.0)),
        mask_bytes=dropout_mask_bytes(device_type, torch.bfloat16 if bits16 else torch.float32),
        calibrated=str(path) if path else "",
        device_type=device_type,
        sm_count=config.sm_count,
        host_memory=config.host_memory_gb * GB,
        host_step_bandwidth=config.host_step_gbps * GB,
    )


def accelerator_cluster(world: int, precision: str, preset: str = "h100_node") -> Cluster:
    """`preset`'s nodes, as many as `world` ranks fill (8 per node, or fewer on one node), with
    its constants as given: what a dry run, which stands for an accelerator, is priced on."""
    per_node = min(8, world)
    config = replace(
        load_preset(preset), gpus_per_node=per_node, nodes=-(-world // per_node), calibration="none"
    )
    return resolve_cluster(config, precision, cache_dir="/nonexistent")
