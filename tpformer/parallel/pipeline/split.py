"""parallel.pipeline_split -> layers per (virtual) stage: balanced from FLOPs, profiled on this
device, or the user's list. Every rank must arrive at the same split, so measured times are
rank 0's, broadcast."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from tpformer.parallel.comm import broadcast_object, process_group
from tpformer.parallel.context import GroupHandle
from tpformer.parallel.pipeline.partition import (
    ReplicatedStage,
    StageCosts,
    best_split,
    check_split,
    equal_split,
    pipedream_partition,
    replication_string,
)
from tpformer.parallel.pipeline.stage import pipelined

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


def flop_costs(hidden: int, seq: int, vocab: int, head_fraction: float, layers: int) -> StageCosts:
    """Costs in layer units: a layer does ~24h^2 + 4sh FLOPs per token, the output head
    2hV x (share of tokens it runs on); the embedding lookup has no matmul."""
    layer = 24 * hidden * hidden + 4 * seq * hidden
    return StageCosts([1.0] * layers, head=2 * hidden * vocab * head_fraction / layer)


def _timed(fn, repeats: int = 3) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def profile_costs(model: nn.Module, sample: dict[str, Tensor]) -> StageCosts:
    """Forward+backward seconds of the embedding, each block and the head on one micro-batch
    (median of 3), and the activation's transfer time at LINK_BYTES_PER_S."""
    parts = pipelined(model)
    blocks = list(parts.blocks())
    mask = parts.block_mask(**sample)

    def through(fn, x: Tensor | None) -> Tensor:
        inp = None if x is None else x.detach().requires_grad_()
        out = fn(inp)
        loss = out if isinstance(out, Tensor) else out.loss
        torch.autograd.backward(loss, torch.ones_like(loss))
        return out

    x = parts.embed(**sample).detach()
    embedding = _timed(lambda: through(lambda _: parts.embed(**sample), None))
    layers = []
    for block in blocks:
        layers.append(_timed(lambda: through(lambda inp: block(inp, mask), x)))  # noqa: B023 - timed now
        x = block(x, mask).detach()
    head = _timed(lambda: through(lambda inp: parts.head(inp, **sample), x))
    model.zero_grad(set_to_none=True)
    return StageCosts(layers, embedding, head, x.nbytes / LINK_BYTES_PER_S)


def choose_split(
    model: nn.Module,
    setting: Any,
    stages: int,
    chunks: int,
    *,
    head_fraction: float,
    seq: int,
    sample: dict[str, Tensor] | None,
) -> SplitChoice:
    """The split of `model`'s blocks for parallel.pipeline_split=`setting`."""
    config: Any = model.config  # a model's ModelConfig (parallel/ does not import config/)
    layers, parts = config.num_layers, stages * chunks
    flops = flop_costs(config.hidden_size, seq, config.vocab_size, head_fraction, layers)
    if not isinstance(setting, str):
        return SplitChoice(
            check_split(list(setting), layers, parts, f"{parts} stages"), flops, "layers"
        )
    if setting == "profile":
        if sample is None:
            raise ValueError("parallel.pipeline_split=profile needs a sample micro-batch")
        was_training = model.training
        costs = broadcast_object(profile_costs(model, sample))
        model.train(was_training)
        return SplitChoice(best_split(costs, parts), costs, "s")  # type: ignore[arg-type]
    if chunks > 1:  # interleaved chunks stay equal
        return SplitChoice(equal_split(layers, parts), flops, "layers")
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


def allreduce_bandwidth(handle: GroupHandle, device: torch.device, numel: int = 1 << 22) -> float:
    """Bus bandwidth (bytes/s, NCCL's convention: 2 (n - 1) / n x bytes / time) of an all-reduce
    over `handle` on this device: median of 3 after a warm-up. Every rank of it must call."""
    if handle.size == 1:
        return float("inf")
    x = torch.ones(numel, device=device)
    group = process_group(handle)

    def reduce() -> None:
        dist.all_reduce(x, group=group)
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    reduce()
    seconds = _timed(reduce)
    return 2 * (handle.size - 1) / handle.size * x.nbytes / seconds


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
    choice = broadcast_object(choice)  # type: ignore[assignment]
    if isinstance(choice, ValueError):
        raise choice
    assert choice is not None
    return choice
