"""The tensors a rank needs to continue exactly: parameters, fp32 masters, AdamW moments."""

from __future__ import annotations

import torch

from tpformer.engine.zero import ZeroEngine


def _optimizer_slots(engine: ZeroEngine, param: torch.nn.Parameter) -> dict[str, torch.Tensor]:
    """AdamW's state of one flat view, created (zeros, step 0) if it has not stepped yet."""
    state = engine.optimizer.state[param]
    if not state:
        state["step"] = torch.zeros((), dtype=torch.float32, device=param.device)
        state["exp_avg"] = torch.zeros_like(param)
        state["exp_avg_sq"] = torch.zeros_like(param)
    return state


def engine_state_dict(engine: ZeroEngine) -> dict[str, object]:
    """This rank's engine state as a nested dict of tensors (the layout-specific flat form)."""
    buckets = {}
    for i, state in enumerate(engine.states):
        params = state.param_shard if engine.stage == 3 else state.full
        buckets[str(i)] = {
            "params": params,
            "master": state.master,
            "optimizer": {str(j): dict(_optimizer_slots(engine, p))
                          for j, (p, _, _, _) in enumerate(state.opt_params)},
        }
    return {"buckets": buckets, "loss_scale": torch.tensor(engine.scaler.scale),
            "clean_steps": torch.tensor(engine.scaler.clean_steps),
            "nonfinite_steps": torch.tensor(engine.nonfinite_steps)}


def load_engine_state_dict(engine: ZeroEngine, loaded: dict[str, object]) -> None:
    """Copy a state produced by `engine_state_dict` (after DCP filled it in place) back."""
    for i, state in enumerate(engine.states):
        bucket = loaded["buckets"][str(i)]  # type: ignore[index]
        with torch.no_grad():
            target = state.param_shard if engine.stage == 3 else state.full
            target.copy_(bucket["params"])
            state.master.copy_(bucket["master"])
        for j, (p, _, _, _) in enumerate(state.opt_params):
            slots = _optimizer_slots(engine, p)
            for key, value in bucket["optimizer"][str(j)].items():
                slots[key].copy_(value)
    engine.scaler.scale = float(loaded["loss_scale"])  # type: ignore[arg-type]
    engine.scaler.clean_steps = int(loaded["clean_steps"])  # type: ignore[arg-type]
    engine.nonfinite_steps = int(loaded["nonfinite_steps"])  # type: ignore[arg-type]
