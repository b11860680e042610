"""The cluster group: the machines a layout is planned for."""

from __future__ import annotations

from dataclasses import dataclass

from tpformer.config.schema.choices import ranged


@dataclass
class ClusterConfig:
    """The machines a layout runs on, for tpformer-plan and the startup plan's predictions.
    Presets live in conf/cluster; `auto` takes this machine's devices and the preset of its kind."""

    name: str = "auto"
    """The preset's name; `tpformer-plan --calibrate` stores its measurements under it."""
    gpus_per_node: int = ranged(0, 0)
    """Devices (ranks) per node (0: this launch's local ranks; tpformer-plan: 1 node's devices)."""
    nodes: int = ranged(0, 0)
    """Nodes (0: world size / gpus_per_node, or 1)."""
    device_memory_gb: float = ranged(0.0, 0)
    """Memory of one device (0: the GPU's, or on CPU the host's RAM / gpus_per_node)."""
    peak_tflops_fp32: float = ranged(0.0, 0)
    """Dense fp32 peak of one device (0: the preset of this device kind)."""
    peak_tflops_16bit: float = ranged(0.0, 0)
    """Dense bf16/fp16 peak of one device."""
    peak_tflops_fp8: float = ranged(0.0, 0)
    """Dense fp8 peak of one device (0: none known; parallel.precision=fp8 prices the blocks'
    linear matmuls at the 16-bit peak)."""
    matmul_efficiency: float = ranged(0.0, 0, 1)
    """Fraction of peak large matmuls reach (GPU presets: the measured maximum achievable
    matmul FLOPS; calibration measures it, on CPU per matrix size)."""
    sm_count: int = ranged(0, 0)
    """Streaming multiprocessors of one GPU: each GEMM is priced by its output tiles and waves
    over them (tile and wave quantization); 0 prices by matrix size only (CPU)."""
    memory_gbps: float = ranged(0.0, 0)
    """Device memory bandwidth in GB/s (elementwise work, the optimizer step)."""
    elementwise_passes: float = ranged(0.0, 0)
    """Bytes moved by a layer's non-matmul work over forward+backward, per byte it saves for
    backward (calibration fits it from a timed layer)."""
    dropout_ns: float = ranged(0.0, 0)
    """Nanoseconds to draw and apply one element of dropout noise (tpformer's layout-independent
    masks come from one generator per sample: slow on a CPU, calibration measures it)."""
    layer_overhead_us: float = ranged(0.0, 0)
    """Fixed cost of one layer's forward+backward on one micro-batch (kernel launches, Python),
    what makes tiny micro-batches slow; calibration times a layer on 8 tokens."""
    intra_node_gbps: float = ranged(0.0, 0)
    """Per-device bandwidth of collectives inside a node (NVLink), GB/s."""
    intra_node_latency_us: float = ranged(0.0, 0)
    """Latency of one collective step inside a node, microseconds."""
    inter_node_gbps: float = ranged(0.0, 0)
    """Per-device bandwidth between nodes (InfiniBand), GB/s."""
    inter_node_latency_us: float = ranged(0.0, 0)
    """Latency of one collective step between nodes, microseconds."""
    host_gbps: float = ranged(0.0, 0)
    """Device <-> host bandwidth (PCIe) for CPU offload, GB/s."""
    host_memory_gb: float = ranged(0.0, 0)
    """Host RAM per node that offloaded state may fill (0: not checked)."""
    host_step_gbps: float = ranged(0.0, 0)
    """Host memory bandwidth one device's offloaded optimizer step gets, GB/s (the node's DRAM
    bandwidth / gpus_per_node; 0: priced at host_gbps)."""
    comm_overlap: float = ranged(0.0, 0, 1)
    """Fraction of the data-parallel gradient reduction hidden behind backward."""
    overhead_gb: float = ranged(0.0, 0)
    """Framework memory per device outside model state and activations (CUDA context,
    allocator caches, communication buffers)."""
    calibration: str = "auto"
    """auto: the measurements `tpformer-plan --calibrate` stored for this preset (if any);
    none: the preset's values only; or a calibration JSON file."""
