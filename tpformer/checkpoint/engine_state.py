"""The engine's state in layout-independent form: full logical tensors per parameter name.

Saving gathers each bucket's fp32 master and AdamW moments over DP (flat shards -> whole
bucket), cuts them into parameters and all-gathers TP shards into logical tensors; loading
does the reverse for whatever layout, ZeRO stage and precision the run has. Values are only
copied, never recomputed, so resuming at the same layout is bitwise exact and resuming at
another layout continues the same fp32 optimizer state.

NOTE: every rank holds the full model and its two moments transiently while saving/loading.
"""

from __future__ import annotations

import torch
from torch import Tensor

from tpformer.engine.zero import BucketState, ZeroEngine
from tpformer.parallel.comm import all_gather_async, wait
from tpformer.parallel.init import gather_full, logical_shape, shard_full

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


@torch.no_grad()
def logical_state_dict(engine: ZeroEngine) -> dict[str, Tensor]:
    """{"param/<name>", "exp_avg/<name>", "exp_avg_sq/<name>": logical fp32 tensor, "step"}."""
    engine.settle()
    out: dict[str, Tensor] = {}
    steps = []
    for bucket, state in zip(engine.buckets, engine.states):
        for slot in ("param", *SLOTS):
            whole = _whole_bucket(engine, _master_like(engine, state, slot))
            for seg in bucket.segments:
                out[f"{slot}/{seg.name}"] = gather_full(seg.param, engine.ctx.tp,
                                                        bucket.view(whole, seg)).cpu()
        steps += [_optimizer_slots(engine, p)["step"] for p, _, _, _ in state.opt_params]
    out["step"] = steps[0].detach().cpu().clone()
    return out


def logical_template(engine: ZeroEngine) -> dict[str, Tensor]:
    """Empty tensors of the shapes `logical_state_dict` produces, for DCP to load into."""
    out = {"step": torch.zeros(())}
    for bucket in engine.buckets:
        for seg in bucket.segments:
            shape = logical_shape(_like(seg))
            for slot in ("param", *SLOTS):
                out[f"{slot}/{seg.name}"] = torch.empty(shape)
    return out


def _like(seg) -> Tensor:  # a meta tensor carrying the segment's TP metadata
    t = torch.empty(seg.shape, device="meta")
    for attr in ("tp_dim", "tp_logical_size"):
        if hasattr(seg.param, attr):
            setattr(t, attr, getattr(seg.param, attr))
    return t


@torch.no_grad()
def load_logical_state_dict(engine: ZeroEngine, loaded: dict[str, Tensor]) -> None:
    """Distribute logical tensors into this rank's TP slices and DP partitions."""
    engine.settle()
    tp = engine.ctx.tp
    for bucket, state in zip(engine.buckets, engine.states):
        for slot in ("param", *SLOTS):
            whole = torch.zeros(bucket.padded_numel, dtype=torch.float32)
            for seg in bucket.segments:
                bucket.view(whole, seg).copy_(shard_full(loaded[f"{slot}/{seg.name}"], _like(seg), tp))
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
