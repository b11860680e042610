"""parallel.pipeline_split -> layers per (virtual) stage: balanced from FLOPs, profiled on this
device, or the user's list. Every rank must arrive at the same split, so measured times are
rank 0's, broadcast."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, replace

import torch
from torch import Tensor, nn

from tpformer.config.schema import ModelConfig, ParallelConfig
from tpformer.models.costs import head_flops_per_token, layer_flops_per_token
from tpformer.parallel.comm import broadcast_object
from tpformer.parallel.context import ParallelContext
from tpformer.parallel.handle import GroupHandle
from tpformer.parallel.layout import check_split
from tpformer.parallel.link_timing import allreduce_bandwidth, median_seconds
from tpformer.parallel.monitor import CommMonitor
from tpformer.parallel.pipeline.stage import pipelined
from tpformer.planner.partition import (
    ReplicatedStage,
    StageCosts,
    best_split,
    equal_split,
    pipedream_partition,
    replication_string,
)

log = logging.getLogger(__name__)

LINK_BYTES_PER_S = 10e9
"""Assumed stage-to-stage bandwidth for the transfer cost of `profile` (an InfiniBand link)."""


@dataclass
class SplitChoice:
    split: list[int]
    """Layers per virtual stage (stage r's chunks are entries r, r + p, ...)."""
    costs: StageCosts
    """What the split was chosen on (seconds when profiled, layer-equivalents when balanced)."""
    unit: str

    def stage_costs(self, stages: int) -> list[float]:
        """Predicted forward+backward cost of one micro-batch on each (physical) stage."""
        per_virtual = self.costs.of_split(self.split)
        return [sum(per_virtual[r::stages]) for r in range(stages)]


def flop_costs(config: ModelConfig, seq: int, head_fraction: float) -> StageCosts:
    """Costs in layer units from the one FLOP count (models/costs.py): each layer 1, the
    output head its FLOPs over the share of tokens it runs on; the embedding lookup has no
    matmul."""
    return layer_unit_costs(head_per_layer(config, seq, head_fraction), config.num_layers)


def head_per_layer(config: ModelConfig, seq: int, head_fraction: float) -> float:
    """The vocabulary head's FLOPs per sample token, in layers."""
    layer = layer_flops_per_token(config, seq)
    return head_fraction * head_flops_per_token(config) / layer


def layer_unit_costs(head: float, layers: int) -> StageCosts:
    return StageCosts([1.0] * layers, head=head)


def profile_costs(model: nn.Module, sample: dict[str, Tensor]) -> StageCosts:
    """Forward+backward seconds of the embedding, each block and the head on one micro-batch
    (median of 3 after a warm-up, the device synchronized around each), and the activation's
    transfer time at LINK_BYTES_PER_S."""
    parts = pipelined(model)
    blocks = list(parts.blocks())
    mask, positions = parts.block_mask(**sample), parts.block_positions(**sample)

    def through(fn, x: Tensor | None) -> Tensor:
        inp = None if x is None else x.detach().requires_grad_()
        out = fn(inp)
        loss = out if isinstance(out, Tensor) else out.loss
        torch.autograd.backward(loss, torch.ones_like(loss))
        return out

    x = parts.embed(**sample).detach()
    device = x.device
    embedding = median_seconds(lambda: through(lambda _: parts.embed(**sample), None), device)
    layers = []
    for block in blocks:

        def run(inp: Tensor, block: nn.Module = block) -> Tensor:
            return block(inp, mask, None, positions)

        layers.append(median_seconds(lambda: through(run, x), device))  # noqa: B023 - timed now
        x = run(x).detach()
    head = median_seconds(lambda: through(lambda inp: parts.head(inp, **sample), x), device)
    model.zero_grad(set_to_none=True)
    return StageCosts(layers, embedding, head, x.nbytes / LINK_BYTES_PER_S)


def choose_split(
    config: ModelConfig,
    mode: str,
    layers: list[int],
    stages: int,
    chunks: int,
    *,
    head_fraction: float,
    seq: int,
    timed: tuple[nn.Module, dict[str, Tensor]] | None = None,
    monitor: CommMonitor | None = None,
) -> SplitChoice:
    """The split of a `config` model's blocks: `layers` (parallel.pipeline_layers) if given,
    else as parallel.pipeline_split=`mode` chooses (profile: `timed`'s model on its sample,
    rank 0's times, broadcast and recorded in `monitor`)."""
    parts = stages * chunks
    flops = flop_costs(config, seq, head_fraction)
    if layers:
        checked = check_split(list(layers), config.num_layers, parts, f"{parts} stages")
        return SplitChoice(checked, flops, "layers")
    if mode == "profile":
        if timed is None:
            raise ValueError("parallel.pipeline_split=profile needs a model and a sample batch")
        model, sample = timed
        was_training = model.training
        costs = broadcast_object(profile_costs(model, sample), monitor=monitor)
        model.train(was_training)
        return SplitChoice(best_split(costs, parts), costs, "s")  # type: ignore[arg-type]
    if chunks > 1:  # interleaved chunks stay equal
        return SplitChoice(equal_split(config.num_layers, parts), flops, "layers")
    return SplitChoice(best_split(flops, parts), flops, "layers")


def layer_weight_bytes(model: nn.Module) -> list[float]:
    """Bytes of each block's parameters, the rest (embedding, tied head, final norm) split
    between the first and the last block: what a replicated stage all-reduces."""
    blocks = list(pipelined(model).blocks())
    sizes = [float(sum(p.nbytes for p in b.parameters())) for b in blocks]
    in_blocks = {id(p) for b in blocks for p in b.parameters()}
    rest = float(sum(p.nbytes for p in model.parameters() if id(p) not in in_blocks))
    sizes[0] += rest / 2
    sizes[-1] += rest / 2
    return sizes


@dataclass
class ReplicationChoice:
    """parallel.pipeline_split=pipedream's answer: layers and workers per stage."""

    stages: list[ReplicatedStage]
    slowest: float
    """Predicted seconds per micro-batch of the slowest stage."""
    costs: StageCosts
    bandwidth: float

    @property
    def split(self) -> list[int]:
        return [s.layers for s in self.stages]

    @property
    def replicas(self) -> list[int]:
        return [s.replicas for s in self.stages]

    def describe(self) -> str:
        return (
            f"pipedream partition: {replication_string(self.stages)} (workers per stage), "
            f"layers {self.split}; slowest stage {self.slowest * 1e3:.1f} ms per micro-batch "
            f"(profiled layers {', '.join(f'{t * 1e3:.1f}' for t in self.costs.layers)} ms, "
            f"all-reduce {self.bandwidth / 1e9:.2f} GB/s measured)"
        )


def choose_replication(
    model: nn.Module,
    sample: dict[str, Tensor],
    world: GroupHandle,
    device: torch.device,
    *,
    stages: int,
    micro_batches: int,
) -> ReplicationChoice:
    """PipeDream's partitioner on this run: rank 0's profiled layer times and the all-reduce
    bandwidth measured over `world` (every rank calls), `stages` stages whose replica counts
    divide the step's `micro_batches`; every rank gets rank 0's choice."""
    bandwidth = allreduce_bandwidth(world, device)
    choice: ReplicationChoice | ValueError | None = None
    if world.rank == 0:
        was_training = model.training
        costs = profile_costs(model, sample)
        model.train(was_training)
        try:
            chosen, slowest = pipedream_partition(
                costs,
                layer_weight_bytes(model),
                world.size,
                bandwidth,
                stages=stages,
                divides=micro_batches,
            )
            choice = ReplicationChoice(chosen, slowest, costs, bandwidth)
        except ValueError as err:  # every rank raises it, none waits for a choice
            choice = err
    choice = broadcast_object(choice, monitor=world.monitor)  # type: ignore[assignment]
    if isinstance(choice, ValueError):
        raise choice
    assert choice is not None
    return choice


@dataclass
class PipelinePlan:
    """What a pipelined run executes, chosen before the model is parallelized."""

    split: SplitChoice
    parallel: ParallelConfig
    """The final parallel config (pipeline_split=pipedream: the chosen layers and workers per
    stage written into pipeline_layers and pipeline_replicas, so checkpoints record them)."""
    ctx: ParallelContext
    """The context, regrouped for the chosen workers per stage (pipedream)."""


def plan_pipeline(
    build: Callable[[], nn.Module],
    config: ModelConfig,
    parallel: ParallelConfig,
    ctx: ParallelContext,
    *,
    head_fraction: float,
    seq: int,
    micro_batches: int,
    first_batch: Callable[[], dict[str, Tensor]],
) -> PipelinePlan | None:
    """parallel.pipeline_split -> the layers (and, for pipedream, the workers) of each stage of
    ctx's pipeline, or None without one: the config and context are final when this returns,
    before the model that runs is built. profile and pipedream time a model from `build()` on
    `first_batch()` (both made only for them); balanced and a given list need neither."""
    stages = ctx.layout.pp
    if stages == 1:
        return None
    timed = parallel.pipeline_split in ("profile", "pipedream") and not parallel.pipeline_layers
    probe = build() if timed else None
    sample = {k: v.to(ctx.device) for k, v in first_batch().items()} if timed else None
    if probe is not None:
        pipelined(probe)  # what the stages call, checked before anything is timed
    if parallel.pipeline_split == "pipedream":
        assert probe is not None and sample is not None
        replication = choose_replication(
            probe, sample, ctx.pp, ctx.device, stages=stages, micro_batches=micro_batches
        )
        log.info("%s", replication.describe())
        parallel = replace(
            parallel, pipeline_layers=replication.split, pipeline_replicas=replication.replicas
        )
        ctx = ctx.regroup(replication.replicas)
    chunks = parallel.virtual_stages if parallel.pipeline_schedule == "interleaved_1f1b" else 1
    choice = choose_split(
        config,
        parallel.pipeline_split,
        list(parallel.pipeline_layers),
        stages,
        chunks,
        head_fraction=head_fraction,
        seq=seq,
        timed=(probe, sample) if probe is not None and sample is not None else None,
        monitor=ctx.monitor,
    )
    return PipelinePlan(choice, parallel, ctx)
