"""The rules of the parallel group (and the optimizer settings the engine takes with it): the
engine's stages, offload and precision, sequence and context parallelism against the sequence
length, the pipeline's stages, schedules, replicas and recomputation granularity."""

from __future__ import annotations

import math

from tpformer.config.rules.choices import check_choices
from tpformer.config.schema import OptimConfig, ParallelConfig
from tpformer.parallel.layout import Layout, check_split


def validate_engine(parallel: ParallelConfig, optim: OptimConfig, device_type: str) -> None:
    """Reject bad engine settings before any buffer or collective exists."""
    check_choices(parallel, "parallel.")
    check_choices(optim, "optim.")
    if parallel.cpu_offload == "optimizer+params" and parallel.zero_stage != 3:
        raise ValueError(
            f"parallel.cpu_offload=optimizer+params needs parallel.zero_stage=3 "
            f"(got {parallel.zero_stage}): only stage 3 keeps parameter partitions"
        )
    if parallel.grad_compression == "powersgd" and parallel.zero_stage > 1:
        raise ValueError(
            f"parallel.grad_compression=powersgd needs parallel.zero_stage 0 or 1 "
            f"(got {parallel.zero_stage}): stages 2-3 keep only gradient shards, which "
            "low-rank factors of whole matrices do not split into; use "
            "grad_compression=bf16 (any stage) or none"
        )
    if parallel.precision == "fp16" and device_type == "cpu":
        raise ValueError(
            "parallel.precision=fp16 needs a GPU: CPU kernels for half precision are "
            "slow or missing; use parallel.precision=bf16 or fp32 on CPU"
        )
    if optim.min_lr > optim.lr:
        raise ValueError(f"optim.min_lr={optim.min_lr} must not exceed optim.lr={optim.lr}")


def validate_sequence_parallel(parallel: ParallelConfig, tp: int, seq_length: int | None) -> None:
    """Sequence parallelism splits each sequence over the TP group (of `tp` ranks): it needs
    one, and (for the fixed-length pretraining sequences) a length it divides. Fine-tuning pads
    instead."""
    if not parallel.sequence_parallel:
        return
    if tp == 1:
        raise ValueError(
            "parallel.sequence_parallel=true needs parallel.tensor > 1 (got "
            "parallel.tensor=1): it splits the sequence across the TP group"
        )
    if seq_length is not None and seq_length % tp:
        below = seq_length - seq_length % tp
        raise ValueError(
            f"data.seq_length={seq_length} must be divisible by parallel.tensor="
            f"{tp} with parallel.sequence_parallel=true (e.g. {below} or {below + tp})"
        )


def context_multiple(cp: int, tp: int, sequence_parallel: bool) -> int:
    """What a sequence length must be a multiple of for context parallelism (two mirrored chunks
    per CP rank) and, with sequence parallelism, for the TP split of each CP rank's part."""
    multiple = 2 * cp if cp > 1 else 1
    return math.lcm(multiple, cp * tp) if sequence_parallel else multiple


def validate_context_parallel(
    layout: Layout, parallel: ParallelConfig, seq_length: int | None
) -> None:
    """Context parallelism splits every sequence into 2 x cp chunks (fixed-length pretraining
    sequences must divide; fine-tuning pads instead)."""
    if layout.cp == 1:
        return
    multiple = context_multiple(layout.cp, layout.tp, parallel.sequence_parallel)
    if seq_length is not None and seq_length % multiple:
        below = seq_length - seq_length % multiple
        raise ValueError(
            f"data.seq_length={seq_length} must be divisible by {multiple} with "
            f"parallel.context={layout.cp} (two mirrored chunks per CP rank"
            + (", each split over the TP group" if parallel.sequence_parallel else "")
            + f"); e.g. {below or multiple} or {below + multiple}"
        )


def validate_pipeline(
    parallel: ParallelConfig, p: int, num_layers: int, micro_batches: int
) -> None:
    """Pipeline stages (`p` of them) need layers to hold, micro-batches to fill them and an
    engine that keeps whole gradients; a split list must match the model."""
    schedule = parallel.pipeline_schedule
    split = parallel.pipeline_split
    if p == 1:
        return
    if p > num_layers:
        raise ValueError(
            f"parallel.pipeline={p} exceeds the model's num_layers={num_layers}: "
            f"every stage needs a layer (valid: 1 to {num_layers})"
        )
    if parallel.zero_stage >= 2:
        raise ValueError(
            f"parallel.zero_stage={parallel.zero_stage} is not supported with "
            f"parallel.pipeline={p}: stages 2-3 reduce-scatter (and stage 3 re-gathers) "
            "each layer's gradients and parameters on every micro-batch's backward, "
            "which the pipeline interleaves; use zero_stage 0 or 1 (optimizer state "
            "sharded over each stage's DP group)"
        )
    chunks = parallel.virtual_stages if schedule == "interleaved_1f1b" else 1
    if schedule == "interleaved_1f1b" and micro_batches % p:
        raise ValueError(
            f"parallel.pipeline_schedule=interleaved_1f1b needs the micro-batches per "
            f"step ({micro_batches}) to be a multiple of parallel.pipeline={p}; set "
            f"trainer.grad_accum to a multiple of {p}"
        )
    layers = list(parallel.pipeline_layers)
    if layers and split != "balanced":
        raise ValueError(
            f"parallel.pipeline_layers={layers} is the split; parallel.pipeline_split={split} "
            "would choose another: leave pipeline_split=balanced or pipeline_layers empty"
        )
    if not layers:
        if schedule == "interleaved_1f1b" and split == "balanced" and num_layers % (p * chunks):
            raise ValueError(
                f"parallel.pipeline_schedule=interleaved_1f1b splits the "
                f"num_layers={num_layers} layers into parallel.pipeline={p} x "
                f"parallel.virtual_stages={chunks} equal chunks: it must be a "
                f"multiple of {p * chunks}"
            )
        return
    check_split(
        layers,
        num_layers,
        p * chunks,
        f"parallel.pipeline={p}" + (f" x virtual_stages={chunks}" if chunks > 1 else ""),
    )


def validate_pipedream(parallel: ParallelConfig, p: int, *, compiled: bool) -> None:
    """The asynchronous schedule needs stages, and computes with stashed weight copies that
    fp16's pipeline-wide loss scale and compiled graphs would not follow."""
    if parallel.pipeline_schedule != "pipedream":
        return
    if p < 2:
        raise ValueError(
            f"parallel.pipeline_schedule=pipedream needs parallel.pipeline >= 2 (got {p}): "
            "with one stage there is nothing to run asynchronously; use 1f1b or set "
            "parallel.pipeline"
        )
    if parallel.precision == "fp16":
        raise ValueError(
            "parallel.pipeline_schedule=pipedream does not support parallel.precision=fp16: "
            "each stage updates on its own, so no loss scale is shared by the pipeline; "
            "use fp32 or bf16"
        )
    if compiled:
        raise ValueError(
            "parallel.pipeline_schedule=pipedream does not support trainer.compile=true: "
            "the blocks compute with stashed weight copies swapped in for the parameters; "
            "set trainer.compile=false or use 1f1b"
        )


def validate_replication(
    parallel: ParallelConfig, micro_batches: int, *, finetuning: bool = False
) -> None:
    """Replicated stages (parallel.pipeline_replicas, or chosen by pipeline_split=pipedream)
    exist only in the pipedream schedule, where stages share no weight and update apart; a
    stage's replicas take the step's micro-batches in turn, so their count divides them."""
    replicas, split = list(parallel.pipeline_replicas), parallel.pipeline_split
    if not replicas and split != "pipedream":
        return
    what = (
        f"parallel.pipeline_replicas={replicas}"
        if replicas
        else "parallel.pipeline_split=pipedream"
    )
    if finetuning:
        raise ValueError(f"{what}: replicated pipeline stages are for pretraining runs")
    if parallel.pipeline_schedule != "pipedream":
        raise ValueError(
            f"{what} replicates pipeline stages, which only the asynchronous schedule runs "
            f"(got parallel.pipeline_schedule={parallel.pipeline_schedule}); set "
            "parallel.pipeline_schedule=pipedream"
        )
    if parallel.pipedream_vertical_sync:
        raise ValueError(
            f"{what} does not support parallel.pipedream_vertical_sync=true: replicas of a "
            "stage count their own updates; set it to false"
        )
    if replicas and split == "pipedream":
        raise ValueError(
            f"parallel.pipeline_split=pipedream chooses the replicas itself; leave "
            f"parallel.pipeline_replicas empty (got {replicas}) or give parallel.pipeline_layers"
        )
    uneven = [n for n in replicas if micro_batches % n]
    if uneven:
        raise ValueError(
            f"{what}: a stage's replicas take the {micro_batches} micro-batches of a step "
            f"(trainer.grad_accum) in turn, so every count must divide it; {uneven} do not"
        )


def validate_recompute_granularity(parallel: ParallelConfig, num_layers: int) -> None:
    """Full recomputation's granularity must fit the model's layers."""
    if parallel.recompute != "full":
        return
    if parallel.recompute_num_layers > num_layers:
        raise ValueError(
            f"parallel.recompute_num_layers={parallel.recompute_num_layers} must be "
            f"between 0 (all) and the model's num_layers={num_layers}"
        )
    if parallel.recompute_every > num_layers:
        raise ValueError(
            f"parallel.recompute_every={parallel.recompute_every} must be between 1 "
            f"and the model's num_layers={num_layers}"
        )
