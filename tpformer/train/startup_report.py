"""The startup plan: layout, parameters per rank, and the planner's predictions for this run
(memory per rank, step time), with a warning when the layout is predicted not to fit or to be
much slower than the best layout the planner finds for the same world and global batch."""

from __future__ import annotations

import logging
from collections import Counter

from torch import nn

from tpformer.config.families import family_of
from tpformer.config.schema import Config, ModelConfig
from tpformer.layers.attention_core import AttentionCore
from tpformer.parallel.layout import Layout
from tpformer.parallel.pipeline.schedule import Action
from tpformer.parallel.pipeline.simulate import simulate
from tpformer.parallel.random import rng_mode_line
from tpformer.planner.candidate import Workload, candidate_of
from tpformer.planner.cluster import Cluster, resolve_cluster
from tpformer.planner.memory import MemoryPrediction, predict_stage_memory
from tpformer.planner.search import search
from tpformer.planner.split import SplitChoice
from tpformer.planner.step_time import predict_time

log = logging.getLogger("tpformer")
MB = 2**20
SLOWER_WARNING = 1.5
"""Warn when the chosen layout is predicted this many times slower than the best that fits."""


def pipeline_lines(
    config: Config, layout: Layout, choice: SplitChoice, stage_memory: list[MemoryPrediction]
) -> list[str]:
    """The split, each stage's predicted time, the bubble and memory per stage."""
    p, t = config.parallel, config.trainer
    chunks = len(choice.split) // layout.pp
    costs = choice.stage_costs(layout.pp)
    per_virtual = choice.costs.of_split(choice.split)
    # the simulation's forward = 1/3 of forward+backward (backward twice the forward)
    fwd = [c / 3 for c in per_virtual]
    sim = simulate(
        p.pipeline_schedule,
        layout.pp,
        t.grad_accum,
        chunks,
        forward_time=fwd,
        replicas=layout.stage_workers,
        every_step=p.pipedream_update == "step",
    )
    first_worker = [layout.peer(r, 0) for r in range(layout.pp)]
    ideal = t.grad_accum * max(costs)
    asynchronous = (
        _pipedream_lines(config, layout, fwd) if p.pipeline_schedule == "pipedream" else []
    )
    lines = [
        f"pipeline: {layout.pp} stages, schedule {p.pipeline_schedule}"
        + (f" x {chunks} virtual" if chunks > 1 else "")
        + f", {t.grad_accum} micro-batches; split {choice.split} "
        f"(pipeline_split={p.pipeline_split})",
        f"  PP groups: {layout.pp_groups()}",
        f"  predicted bubble {sim.bubble:.1%}; step {sim.makespan:.3g} {choice.unit} vs "
        f"{ideal:.3g} without bubble ((m + p - 1) / m = "
        f"{(t.grad_accum + layout.pp - 1) / t.grad_accum:.2f})",
        *asynchronous,
    ]
    for r in range(layout.pp):
        layers = sum(choice.split[r :: layout.pp])
        memory = stage_memory[r]
        lines.append(
            f"  stage {r}: {layers} layers, {costs[r]:.3g} {choice.unit} per micro-batch, "
            f"{sim.peak_in_flight[first_worker[r]]} micro-batches in flight, memory per rank "
            f"{memory.total / MB:.1f} MB (activations {memory.activations / MB:.1f} MB)"
        )
    return lines


def _pipedream_lines(config: Config, layout: Layout, fwd: list[float]) -> list[str]:
    """What PipeDream's asynchronous schedule does at this setting (updates, weight versions,
    the steady-state bubble, replicated stages)."""
    p, t = config.parallel, config.trainer
    update = "every micro-batch" if p.pipedream_update == "micro_batch" else "every step"
    stale = "the first stage's version" if p.pipedream_vertical_sync else "its own latest"
    lines = [
        f"  pipedream: no flush; each stage updates after {update}'s backwards and runs "
        f"forwards with {stale}, backwards with the forward's (up to p - r stashed versions "
        f"on stage r); steady-state bubble {_steady_bubble(layout, t.grad_accum, fwd):.0%} "
        "(the line above counts one step from empty, drained)"
    ]
    if layout.stage_workers:
        lines.append(
            f"  replicated stages {'-'.join(map(str, layout.stage_workers))}: stage r runs on "
            "replicas[r] workers that take its micro-batches in turn and update together "
            "(gradients summed over the DP groups above)"
        )
    return lines


def _steady_bubble(layout: Layout, micro: int, forward_time: list[float]) -> float:
    """Idle share of the workers between their forwards of micro-batches 2m.. and 4m..
    (pipedream; a replica's own first forwards at or after them), stages taking
    `forward_time` (backward twice that)."""
    sim = simulate(
        "pipedream",
        layout.pp,
        micro,
        steps=6,
        forward_time=forward_time,
        replicas=layout.stage_workers,
    )
    idle = span = 0.0
    for worker, timeline in enumerate(sim.timeline):
        forwards = [a.micro for a, _, _ in timeline if a.kind == "F"]
        first = Action("F", min(i for i in forwards if i >= 2 * micro))
        last = Action("F", min(i for i in forwards if i >= 4 * micro))
        idle += sim.idle_between(worker, first, last)
        span += sim.span(worker, first, last)
    return idle / span


def run_cluster(config: Config, layout: Layout) -> Cluster:
    """The cluster this run is on (cluster=auto: this launch's devices)."""
    return resolve_cluster(
        config.cluster,
        str(config.parallel.precision),
        cache_dir=config.data.cache_dir,
        world_size=layout.world_size,
    )


def predict_memory_of(config: Config, layout: Layout, cluster: Cluster) -> list[MemoryPrediction]:
    """Memory per rank of each pipeline stage of this run."""
    global_batch = config.trainer.micro_batch_size * config.trainer.grad_accum * layout.dp
    return predict_stage_memory(
        Workload.of(config, global_batch), candidate_of(config, layout.dp), cluster
    )


def prediction_lines(
    config: Config,
    layout: Layout,
    cluster: Cluster,
    device_type: str,
    stage_memory: list[MemoryPrediction],
) -> tuple[list[str], list[str]]:
    """(plan lines, warnings): this layout's predicted memory (`stage_memory`, per pipeline
    stage) and step time, and how it compares with the best layout for the same world size
    and global batch."""
    global_batch = config.trainer.micro_batch_size * config.trainer.grad_accum * layout.dp
    work = Workload.of(config, global_batch)
    memory = max(stage_memory, key=lambda m: m.total)
    time = predict_time(work, candidate_of(config, layout.dp), cluster)
    device = cluster.device_memory
    lines = [
        f"memory per rank (predicted{f', stage {memory.stage}' if layout.pp > 1 else ''}): "
        f"params {memory.params / MB:.1f} MB, grads {memory.grads / MB:.1f} MB (fp32), optimizer "
        f"{memory.optimizer / MB:.1f} MB, activations {memory.activations / MB:.1f} MB, "
        f"buffers {memory.buffers / MB:.1f} MB, overhead {memory.overhead / MB:.1f} MB, total "
        f"{memory.total / MB:.1f} MB of {device / MB:,.0f} MB"
        + (f" (+ {memory.host / MB:.1f} MB offloaded)" if memory.host else ""),
        f"step time (predicted on cluster {cluster.name}): {time.step:.3g} s (compute "
        f"{time.compute:.3g}, {'TP+CP' if layout.cp > 1 else 'TP'} {time.tensor_comm:.3g}, "
        f"bubble {time.bubble:.3g}, DP "
        f"{time.data_comm:.3g}, optimizer {time.optimizer:.3g}), "
        f"{time.tokens_per_s(work):,.0f} tokens/s, MFU {time.mfu(cluster):.1%}",
    ]
    warnings = []
    if memory.total > device:
        warnings.append(
            f"this layout is predicted to run out of memory: {memory.total / MB:,.0f} "
            f"MB per rank > {device / MB:,.0f} MB (cluster.device_memory_gb); "
            "`tpformer-plan` lists layouts that fit"
        )
    try:
        best = search(work, cluster, device_type=device_type).best
    except ValueError as err:  # no layout fits: the memory warning above says so
        lines.append(f"best layout: none ({err})")
        return lines, warnings
    assert best.time is not None
    ratio = time.step / best.time.step
    lines.append(
        f"best layout for world {layout.world_size}, global batch {global_batch}: "
        f"{best.candidate.label()} ({best.time.step:.3g} s; this one {ratio:.2f}x)"
    )
    if ratio > SLOWER_WARNING:
        warnings.append(
            f"this layout is predicted {ratio:.1f}x slower than the best that fits: "
            f"{' '.join(best.candidate.overrides())}"
        )
    return lines, warnings


def format_plan(
    config: Config,
    layout: Layout,
    stage_params: list[int],
    total_params: int,
    checkpointed: list[str],
    split: SplitChoice | None = None,
    *,
    device_type: str = "cpu",
    attention: str = "",
    matmuls: str = "",
) -> tuple[str, list[str]]:
    """(the startup plan, warnings); `stage_params`: parameters per rank on each stage;
    `attention` and `matmuls`: the lines of `attention_line` and `matmul_line`."""
    t = config.trainer
    global_batch = t.micro_batch_size * t.grad_accum * layout.dp
    pp = f"pp {layout.pp} x " if layout.pp > 1 else ""
    cluster = run_cluster(config, layout)
    stage_memory = predict_memory_of(config, layout, cluster)
    warnings: list[str] = []
    if layout.stage_workers:  # the planner prices regular grids only: its numbers would mislead
        predicted = ["step time: the planner does not model replicated stages"]
    else:
        predicted, warnings = prediction_lines(config, layout, cluster, device_type, stage_memory)
    cp = f" x cp {layout.cp}" if layout.cp > 1 else ""
    dp = (
        f"replicas {'-'.join(map(str, layout.stage_workers))}"
        if layout.stage_workers
        else f"dp {layout.dp}"
    )
    lines = [
        f"layout: world {layout.world_size} = {pp}{dp}{cp} x tp {layout.tp}",
        f"  TP groups: {layout.tp_groups()}",
        f"  DP groups: {layout.dp_groups()}",
        *(
            [
                f"  CP rings: {layout.cp_groups()} (each rank holds 2 mirrored chunks of "
                f"{config.data.seq_length // (2 * layout.cp)} tokens; gradients summed over "
                f"DP x CP {layout.dp_cp_groups()})"
            ]
            if layout.cp > 1
            else []
        ),
        *(pipeline_lines(config, layout, split, stage_memory) if split is not None else []),
        f"model: {_family(config.model)} {config.model.num_layers} layers, hidden "
        f"{config.model.hidden_size}, {_heads(config.model)}; {total_params:,} parameters, "
        f"{stage_params[0]:,} per rank" + (" (stage 0)" if layout.pp > 1 else ""),
        f"batch: global {global_batch} = micro {t.micro_batch_size} x accum {t.grad_accum} x dp "
        f"{layout.dp}, seq {config.data.seq_length}" + _packing(config),
        *[line for line in (attention, matmuls) if line],
        f"engine: zero_stage {config.parallel.zero_stage}, cpu_offload "
        f"{config.parallel.cpu_offload}, precision {config.parallel.precision}, "
        f"checkpointing {config.parallel.recompute} ({len(checkpointed)} wrapped), "
        f"sequence_parallel {str(config.parallel.sequence_parallel).lower()}, compile "
        f"{str(config.trainer.compile).lower()}",
        rng_mode_line(config.parallel.rng, device_type),
        *predicted,
    ]
    return "\n".join(lines), warnings


def _packing(config: Config) -> str:
    """data.pack on the batch line: what it costs the attention kernels."""
    if not config.data.pack:
        return ""
    return (
        "; documents packed (each attends within itself: a [micro, 1, seq, seq] document mask, "
        "so CUDA runs the memory-efficient kernel, not flash)"
    )


def attention_line(model: nn.Module) -> str:
    """Which attention core each layer runs (chosen when the model was built: layers/
    attention_core.py), with why, layers counted per kind. Every rank builds the whole model
    before a pipeline keeps its stage's part, and the choice does not depend on the stage."""
    kinds = Counter(m.describe() for m in model.modules() if isinstance(m, AttentionCore))
    return "attention: " + "; ".join(
        f"{n} layer{'s' if n > 1 else ''} {kind}" for kind, n in kinds.items()
    )


def matmul_line(model: nn.Module) -> str:
    """Which linears run their matmuls in fp8 (parallel.precision=fp8: the engine set them), or
    "" when none does."""
    fp8 = sum(1 for m in model.modules() if getattr(m, "fp8", None) is not None)
    if not fp8:
        return ""
    return (
        f"matmuls: {fp8} block linears in fp8 (torch._scaled_mm: e4m3 inputs and weights, e5m2 "
        "gradients, tensor-wise scales reduced over TP and CP); the rest in bf16"
    )


def _family(model: ModelConfig) -> str:
    """The family (config/families/), with the options its blocks take named when set (the
    family rules keep each option to the families that build it)."""
    local = model.local_attention
    window = f"window {local.window}, global every {local.global_every} layers" if local else ""
    blocks = [
        *(["pre-norm"] if model.norm.position == "pre" else []),
        *(["rope"] if model.rotary is not None else []),
        *([window] if window else []),
        *(["rmsnorm"] if model.norm.kind == "rmsnorm" else []),
        *([f"gated {model.mlp.activation}"] if model.mlp.gated else []),
        *(["no bias"] if not model.bias else []),
        *(["untied head"] if not model.tie_embeddings else []),
        *(
            [f"MLM only, {model.classifier_pooling}-pooled classifier"]
            if model.pooler == "head"
            else []
        ),
    ]
    name = family_of(model).name
    return f"{name} ({', '.join(blocks)})" if blocks else name


def _heads(model: ModelConfig) -> str:
    kv = "" if model.kv_heads == model.num_heads else f" ({model.kv_heads} key/value)"
    return f"{model.num_heads} heads{kv}"
