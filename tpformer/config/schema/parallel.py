"""The parallel group: how the world is split and how randomness is keyed."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Union

from tpformer.config.schema.choices import (
    CpuOffload,
    GradCompression,
    PipeDreamUpdate,
    PipelineSchedule,
    PipelineSplit,
    Precision,
    Recompute,
    RngMode,
    ZeroStage,
    ranged,
)


@dataclass
class ParallelConfig:
    """How the world is split and how randomness is keyed."""

    tensor: Union[int, str] = ranged(1, 1)  # noqa: UP007 (OmegaConf reads typing.Union only)
    """TP degree: must divide the attention heads, hidden size and world size; "auto" (pretraining):
    the planner's fastest layout for the world the run finds, the other keys as set."""
    data: str = "auto"
    """DP degree, or "auto" = world_size / (tensor x pipeline x context)."""
    seed: int = ranged(1234, 0)
    """Seeds weight init and every dropout mask."""
    rng: RngMode = RngMode.auto
    """exact: dropout masks are keyed by global sample and position, the same in every layout
    (any layout reproduces the TP=1 losses); fast: Megatron-style streams, one call per tensor,
    attention dropout inside the fused SDPA kernel (deterministic, not layout-independent);
    auto: fast on accelerators, exact on the CPU."""
    zero_stage: ZeroStage = field(default=ZeroStage(0))
    """0: plain DP; 1: shard optimizer state; 2: + gradients; 3: + parameters (over DP)."""
    cpu_offload: CpuOffload = field(default=CpuOffload("none"))
    """none, optimizer (state, master weights and step on CPU) or optimizer+params (ZeRO-3)."""
    precision: Precision = Precision.fp32
    """fp32, bf16 (bf16 compute, fp32 master weights), fp16 (+ dynamic loss scaling) or fp8 (bf16,
    with the blocks' linear matmuls in fp8: e4m3 activations and weights, e5m2 gradients,
    tensor-wise scales of the whole tensor; docs/parallel/precision.md)."""
    recompute: Recompute = Recompute.none
    """Activation recomputation (activation checkpointing): none; selective (recompute the
    attention core); full (recompute whole layers)."""
    recompute_num_layers: int = ranged(0, 0)
    """full: recompute only the first N layers (0 = all of them)."""
    recompute_every: int = ranged(1, 1)
    """full: recompute every k-th layer among those (1 = each one)."""
    recompute_offload: bool = False
    """full: keep the recomputed layers' inputs on the CPU between forward and backward."""
    bucket_mb: float = ranged(0.0, 0.0)
    """Largest gradient bucket, in MiB of fp32 gradient (DDP's bucket_cap_mb, DeepSpeed's
    reduce_bucket_size): blocks and the other parameters are cut into buckets of at most this
    size at parameter boundaries, so DP reductions start sooner and ZeRO-2/3 hold smaller whole
    gradients (ZeRO-3 still gathers a block's parameters for its forward). 0: one bucket per
    block."""
    grad_compression: GradCompression = GradCompression.none
    """DP gradient reduction: none; bf16 (sent and summed in bfloat16, any ZeRO stage); powersgd
    (rank-powersgd_rank factors with error feedback, ZeRO stages 0-1)."""
    powersgd_rank: int = ranged(1, 1)
    """powersgd: rank of the low-rank approximation of each matrix gradient."""
    powersgd_start_step: int = ranged(10, 0)
    """powersgd: steps reduced uncompressed before compression starts (warm-up)."""
    gloo_shortcuts: bool = True
    """CPU (gloo) only: two-rank groups swap tensors point to point instead of running gloo's
    collectives, and reduce-scatter runs as all-reduce + slice (both faster on gloo, same sums);
    false takes the generic collectives NCCL takes (the tests prove that path on the CPU)."""
    sequence_parallel: bool = False
    """Megatron-SP: LayerNorm, dropout and residual activations hold 1/tensor of the sequence
    (needs tensor > 1 and a sequence length divisible by tensor); same losses as without."""
    pipeline: Union[int, str] = ranged(1, 1)  # noqa: UP007
    """PP degree: pipeline stages, the outermost mesh dim (put it across nodes); "auto" as for
    tensor."""
    context: int = ranged(1, 1)
    """CP degree (context parallelism): each sequence is split over this many ranks (two
    mirrored chunks each) and attention runs as ring attention over them; the sequence length
    must be divisible by 2 x context. Parameters are replicated over CP: gradients are summed
    and ZeRO shards over DP x CP."""
    pipeline_schedule: PipelineSchedule = field(default=PipelineSchedule("1f1b"))
    """gpipe (all forwards, then all backwards), 1f1b, interleaved_1f1b (virtual_stages
    model chunks per stage): exact, flushed every step; or pipedream (asynchronous 1F1B with
    weight stashing, never flushed: each stage updates on its own, forwards see stale weights,
    docs/parallel/pipeline.md). Micro-batches per step: trainer.grad_accum."""
    virtual_stages: int = ranged(2, 2)
    """interleaved_1f1b: model chunks per stage."""
    pipedream_update: PipeDreamUpdate = PipeDreamUpdate.micro_batch
    """pipedream: each stage updates after every micro-batch's backward (micro_batch, as
    PipeDream), or after every trainer.grad_accum of them (step); each update's gradient is
    the mean over its micro-batches."""
    pipedream_vertical_sync: bool = False
    """pipedream: every stage runs a micro-batch with the weight version the first stage used
    for it (more stashed versions; the staleness is the same on every stage)."""
    pipeline_split: PipelineSplit = PipelineSplit.balanced
    """How the layers are split over the stages: balanced (layer costs from FLOPs, embedding
    and head included), profile (measured on this device), or pipedream (PipeDream's
    partitioner: the split and the workers per stage, from profiled layer times and the
    all-reduce measured between the ranks). pipeline_layers, when given, is the split."""
    pipeline_layers: list[int] = field(default_factory=list)
    """Layers per stage, e.g. [3, 1] (per virtual stage when interleaved): this split, as
    given (pipeline_split stays balanced). Empty: pipeline_split chooses."""
    pipeline_replicas: list[int] = field(default_factory=list)
    """pipedream: workers per stage, e.g. [2, 1] (PipeDream's "2-1": stage 1 on two workers
    that take alternate micro-batches and sum their gradients); the world size is their sum,
    tensor, context and data stay 1. Empty: one worker per stage (x parallel.data)."""
