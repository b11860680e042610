"""The engine's state in layout-independent form: one logical tensor per parameter name.

Saving gathers each bucket's fp32 master and AdamW moments over DP (flat ZeRO shards -> this
TP rank's whole bucket) and cuts them into parameters. A TP-sharded parameter is handed to DCP
as a DTensor (Replicate over "dp", Shard over "tp"), so every TP rank writes its own slice of
the logical tensor and DCP splits the DP replicas' identical slices among them; replicated
parameters are plain tensors that DCP likewise writes once. Loading builds DTensors of the new
layout (or plain full tensors) and DCP reads whatever saved chunks overlap them, which is the
resharding. Values are only copied, never recomputed, so resuming at the same layout is
bitwise exact and resuming at another layout continues the same fp32 optimizer state.

NOTE: every rank holds its TP slice of the model and both moments transiently while saving.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.distributed.tensor import DTensor, Replicate, Shard

from tpformer.engine.flat_buffer import Segment
from tpformer.engine.zero import BucketState, ZeroEngine
from tpformer.parallel.comm import all_gather_async, wait
from tpformer.parallel.context import ParallelContext
from tpformer.parallel.init import gather_full, logical_shape, shard_full, sharded_dim

SLOTS = ("exp_avg", "exp_avg_sq")


def _optimizer_slots(engine: ZeroEngine, param: torch.nn.Parameter) -> dict[str, Tensor]:
    """AdamW's state of one flat view, created (zeros, step 0) if it has not stepped yet."""
    state = engine.optimizer.state[param]
    if not state:
        state["step"] = torch.zeros((), dtype=torch.float32, device=param.device)
        state["exp_avg"] = torch.zeros_like(param)
        state["exp_avg_sq"] = torch.zeros_like(param)
    return state


def _master_like(engine: ZeroEngine, state: BucketState, slot: str) -> Tensor:
    """The master ('param') or a moment laid out like the master (whole or this rank's shard)."""
    if slot == "param":
        return state.master
    return torch.cat([_optimizer_slots(engine, p)[slot] for p, _, _, _ in state.opt_params])


def _whole_bucket(engine: ZeroEngine, local: Tensor) -> Tensor:
    if engine.stage == 0:
        return local.float()
    whole = torch.empty(local.numel() * engine.ctx.dp.size, dtype=torch.float32,
                        device=engine.device)
    wait(all_gather_async(whole, local.float().to(engine.device), engine.ctx.dp))
    return whole


def _valid_rows(seg: Segment, ctx: ParallelContext) -> int | None:
    """Rows of this rank's TP chunk inside the logical tensor (vocabulary padding cut off), when
    the parameter's chunks are the ones a DTensor Shard has (ceil-sized, as torch.chunk);
    None for parameters that are written whole."""
    dim = sharded_dim(seg.param)
    if dim is None or ctx.mesh is None or ctx.tp.size == 1:
        return None
    chunk, logical = seg.shape[dim], seg.param.tp_logical_size  # type: ignore[attr-defined]
    if chunk != -(-logical // ctx.tp.size):
        return None
    return max(0, min(chunk, logical - ctx.tp.rank * chunk))


def _as_dtensor(local: Tensor, seg: Segment, ctx: ParallelContext) -> DTensor:
    shape = logical_shape(_like(seg))
    stride = torch.empty(shape, device="meta").stride()
    return DTensor.from_local(local.to(ctx.mesh.device_type), ctx.mesh,  # type: ignore[union-attr]
                              [Replicate(), Shard(sharded_dim(seg.param))], run_check=False,
                              shape=shape, stride=stride)


def _saved_form(local: Tensor, seg: Segment, ctx: ParallelContext) -> Tensor:
    """This rank's chunk as a DTensor of the logical tensor, or the gathered logical tensor."""
    rows = _valid_rows(seg, ctx)
    if rows is None:
        return gather_full(seg.param, ctx.tp, local).cpu()
    return _as_dtensor(local.narrow(sharded_dim(seg.param), 0, rows).contiguous(), seg, ctx)


def _local_chunk(value: Tensor, seg: Segment, ctx: ParallelContext) -> Tensor:
    """The inverse of `_saved_form`: this rank's chunk, zero-padded as the parameter is."""
    if not isinstance(value, DTensor):
        return shard_full(value, _like(seg), ctx.tp)
    local, dim = value.to_local().cpu(), sharded_dim(seg.param)
    missing = seg.shape[dim] - local.shape[dim]
    if missing:
        pad = list(local.shape)
        pad[dim] = missing
        local = torch.cat([local, local.new_zeros(pad)], dim=dim)
    return local


@torch.no_grad()
def logical_state_dict(engine: ZeroEngine) -> dict[str, Tensor]:
    """{"param/<name>", "exp_avg/<name>", "exp_avg_sq/<name>": fp32 logical tensor (a DTensor
    for TP-sharded parameters), "step"}."""
    engine.settle()
    out: dict[str, Tensor] = {}
    steps = []
    for bucket, state in zip(engine.buckets, engine.states):
        for slot in ("param", *SLOTS):
            whole = _whole_bucket(engine, _master_like(engine, state, slot))
            for seg in bucket.segments:
                out[f"{slot}/{seg.name}"] = _saved_form(bucket.view(whole, seg), seg, engine.ctx)
        steps += [_optimizer_slots(engine, p)["step"] for p, _, _, _ in state.opt_params]
    out["step"] = steps[0].detach().cpu().clone()
    return out


def logical_template(engine: ZeroEngine) -> dict[str, Tensor]:
    """Empty tensors laid out as `logical_state_dict` would at this run's layout, for DCP to
    load into (from a checkpoint of any layout)."""
    out = {"step": torch.zeros(())}
    ctx = engine.ctx
    for bucket in engine.buckets:
        for seg in bucket.segments:
            rows = _valid_rows(seg, ctx)
            for slot in ("param", *SLOTS):
                if rows is None:
                    out[f"{slot}/{seg.name}"] = torch.empty(logical_shape(_like(seg)))
                else:
                    local = list(seg.shape)
                    local[sharded_dim(seg.param)] = rows
                    out[f"{slot}/{seg.name}"] = _as_dtensor(torch.empty(local), seg, ctx)
    return out


def _like(seg: Segment) -> Tensor:  # a meta tensor carrying the segment's TP metadata
    t = torch.empty(seg.shape, device="meta")
    for attr in ("tp_dim", "tp_logical_size"):
        if hasattr(seg.param, attr):
            setattr(t, attr, getattr(seg.param, attr))
    return t


@torch.no_grad()
def load_logical_state_dict(engine: ZeroEngine, loaded: dict[str, Tensor]) -> None:
    """Distribute logical tensors (or DTensors of this layout) into this rank's TP slices and
    DP partitions."""
    engine.settle()
    for bucket, state in zip(engine.buckets, engine.states):
        for slot in ("param", *SLOTS):
            whole = torch.zeros(bucket.padded_numel, dtype=torch.float32)
            for seg in bucket.segments:
                bucket.view(whole, seg).copy_(_local_chunk(loaded[f"{slot}/{seg.name}"], seg,
                                                           engine.ctx))
            mine = whole if engine.stage == 0 else bucket.shard_of(whole)
            if slot == "param":
                state.master.copy_(mine)
                if engine.stage == 3:
                    state.param_shard.copy_(mine)
                else:
                    state.full.copy_(whole)
                continue
            for p, a, b, _ in state.opt_params:
                _optimizer_slots(engine, p)[slot].copy_(mine[a:b])
        for p, _, _, _ in state.opt_params:
            _optimizer_slots(engine, p)["step"].fill_(float(loaded["step"]))


def scalar_state(engine: ZeroEngine) -> dict[str, Tensor]:
    """Loss scaler and non-finite counter, saved beside the logical tensors."""
    return {"loss_scale": torch.tensor(engine.scaler.scale, dtype=torch.float64),
            "clean_steps": torch.tensor(engine.scaler.clean_steps),
            "nonfinite_steps": torch.tensor(engine.nonfinite_steps)}


def load_scalar_state(engine: ZeroEngine, loaded: dict[str, object]) -> None:
    engine.scaler.scale = float(loaded["loss_scale"])  # type: ignore[arg-type]
    engine.scaler.clean_steps = int(loaded["clean_steps"])  # type: ignore[arg-type]
    engine.nonfinite_steps = int(loaded["nonfinite_steps"])  # type: ignore[arg-type]
