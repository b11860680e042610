"""The engine's state in logical, layout-free form: one fp32 tensor per parameter name and slot.

Saving gathers each bucket's fp32 master and optimizer moments over DP x CP (flat ZeRO shards
-> this TP rank's whole bucket) and cuts them into parameters. A TP-sharded parameter is handed
to DCP as a DTensor (Replicate over "dp" and "cp", Shard over "tp"), so every TP rank writes
its own slice of the logical tensor and DCP splits the replicas' identical slices among them;
replicated parameters are plain tensors that DCP likewise writes once. Loading receives
tensors laid out as this layout's `logical_state` (DCP fills them from a checkpoint of any
layout: the resharding) and distributes them into this rank's TP slices and DP partitions.
Values are only copied, never recomputed, so resuming at the same layout is bitwise exact and
resuming at another layout continues the same fp32 optimizer state.

NOTE: every rank holds its TP slice of the model and both moments transiently while saving.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.distributed.tensor import DTensor, Replicate, Shard

from tpformer.engine.flat_buffer import FlatBucket, Segment
from tpformer.engine.optimizer import Master, moments, optimizer_slots
from tpformer.parallel.comm import all_gather_async, wait
from tpformer.parallel.context import ParallelContext
from tpformer.parallel.init import gather_full, logical_shape, shard_full
from tpformer.parallel.param_info import copy_param_info, param_info


def _master_like(optimizer: torch.optim.Optimizer, master: Master, slot: str) -> Tensor:
    """The master ('param') or a moment laid out like the master (whole or this rank's shard)."""
    if slot == "param":
        return master.values
    return torch.cat([optimizer_slots(optimizer, v.param)[slot] for v in master.views])


def _whole_bucket(local: Tensor, ctx: ParallelContext, *, whole: bool) -> Tensor:
    if whole:
        return local.float()
    replicas = ctx.replicas
    gathered = torch.empty(local.numel() * replicas.size, dtype=torch.float32, device=ctx.device)
    wait(all_gather_async(gathered, local.float().to(ctx.device), replicas))
    return gathered


def _valid_rows(seg: Segment, ctx: ParallelContext) -> int | None:
    """Rows of this rank's TP chunk inside the logical tensor (vocabulary padding cut off), when
    the parameter's chunks are the ones a DTensor Shard has (ceil-sized, as torch.chunk);
    None for parameters that are written whole."""
    dim, logical = param_info(seg.param).tp_dim, param_info(seg.param).logical_size
    if dim is None or logical is None or ctx.mesh is None or ctx.tp.size == 1:
        return None
    chunk = seg.shape[dim]
    if chunk != -(-logical // ctx.tp.size):
        return None
    return max(0, min(chunk, logical - ctx.tp.rank * chunk))


def _tp_dim(seg: Segment) -> int:
    """The dim TP shards this segment's parameter along (only asked of sharded parameters)."""
    dim = param_info(seg.param).tp_dim
    assert dim is not None, f"{seg.name} is not TP-sharded"
    return dim


def _as_dtensor(local: Tensor, seg: Segment, ctx: ParallelContext) -> DTensor:
    shape = logical_shape(_like(seg))
    stride = torch.empty(shape, device="meta").stride()
    mesh = ctx.stage_mesh  # a pipeline stage's parameters span its own (dp, cp, tp) ranks only
    assert mesh is not None, "DTensor checkpoints need the device mesh of a distributed run"
    return DTensor.from_local(
        local.to(mesh.device_type),
        mesh,
        [Replicate(), Replicate(), Shard(_tp_dim(seg))],
        run_check=False,
        shape=shape,
        stride=stride,
    )


def _saved_form(local: Tensor, seg: Segment, ctx: ParallelContext) -> Tensor:
    """This rank's chunk as a DTensor of the logical tensor, or the gathered logical tensor."""
    rows = _valid_rows(seg, ctx)
    if rows is None:
        return gather_full(seg.param, ctx.tp, local).cpu()
    return _as_dtensor(local.narrow(_tp_dim(seg), 0, rows).contiguous(), seg, ctx)


def _local_chunk(value: Tensor, seg: Segment, ctx: ParallelContext) -> Tensor:
    """The inverse of `_saved_form`: this rank's chunk, zero-padded as the parameter is."""
    if not isinstance(value, DTensor):
        return shard_full(value, _like(seg), ctx.tp)
    local, dim = value.to_local().cpu(), _tp_dim(seg)
    missing = seg.shape[dim] - local.shape[dim]
    if missing:
        pad = list(local.shape)
        pad[dim] = missing
        local = torch.cat([local, local.new_zeros(pad)], dim=dim)
    return local


@torch.no_grad()
def logical_state(
    buckets: list[FlatBucket],
    masters: list[Master],
    optimizer: torch.optim.Optimizer,
    ctx: ParallelContext,
    *,
    whole: bool,
    weights_only: bool = False,
    saving: bool = False,
) -> dict[str, Tensor]:
    """{"param/<name>", "<slot>/<name>" for each of the optimizer's per-element slots (AdamW's
    exp_avg, exp_avg_sq): fp32 logical tensor (a DTensor for TP-sharded parameters), "step"}.
    `whole`: the masters cover whole buckets (stage 0). `weights_only`: "param/<name>" only.
    `saving`: leave out pipedream's head copies (the first stage writes the name; loading
    reads it into both)."""
    out: dict[str, Tensor] = {}
    steps = []
    slots = ("param",) if weights_only else ("param", *moments(optimizer))
    for bucket, master in zip(buckets, masters):
        for slot in slots:
            gathered = _whole_bucket(_master_like(optimizer, master, slot), ctx, whole=whole)
            for seg in bucket.segments:
                if saving and param_info(seg.param).pipeline_copy:
                    continue  # the first stage writes this name (pipedream's head copy)
                out[f"{slot}/{seg.name}"] = _saved_form(bucket.view(gathered, seg), seg, ctx)
        steps += [optimizer_slots(optimizer, v.param)["step"] for v in master.views]
    if not weights_only:
        out["step"] = steps[0].detach().cpu().clone()
    return out


def parameter_template(named_params: list[tuple[str, torch.nn.Parameter]]) -> dict[str, Tensor]:
    """{"param/<name>": empty logical tensor}: what a model without an engine (export, a
    classifier initialized from a pretraining checkpoint) loads from an engine's checkpoint."""
    return {f"param/{n}": torch.empty(logical_shape(p)) for n, p in named_params}


def _like(seg: Segment) -> Tensor:  # a meta tensor laid out as the segment's parameter
    return copy_param_info(seg.param, torch.empty(seg.shape, device="meta"))


@torch.no_grad()
def load_logical_state(
    buckets: list[FlatBucket],
    masters: list[Master],
    optimizer: torch.optim.Optimizer,
    ctx: ParallelContext,
    loaded: dict[str, Tensor],
    *,
    whole: bool,
) -> list[Tensor]:
    """Distribute logical tensors (or DTensors of this layout) into this rank's masters and
    optimizer state; returns each bucket's whole fp32 parameter values, for the compute copy."""
    params = []
    for bucket, master in zip(buckets, masters):
        for slot in ("param", *moments(optimizer)):
            values = torch.zeros(bucket.padded_numel, dtype=torch.float32)
            for seg in bucket.segments:
                bucket.view(values, seg).copy_(_local_chunk(loaded[f"{slot}/{seg.name}"], seg, ctx))
            mine = values if whole else bucket.shard_of(values)
            if slot == "param":
                master.values.copy_(mine)
                params.append(values)
                continue
            for v in master.views:
                optimizer_slots(optimizer, v.param)[slot].copy_(mine[v.start : v.stop])
        for v in master.views:
            optimizer_slots(optimizer, v.param)["step"].fill_(float(loaded["step"]))
    return params
