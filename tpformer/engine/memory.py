"""Per-rank bytes held in parameters, gradients and optimizer state, next to the ZeRO formula."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from tpformer.engine.zero import ZeroEngine


@dataclass(frozen=True)
class MemoryBytes:
    params: int
    grads: int
    optimizer: int
    """AdamW moments plus the fp32 master weights when they are a separate copy."""

    @property
    def total(self) -> int:
        return self.params + self.grads + self.optimizer


def zero_memory_bytes(stage: int, n_params: int, dp: int, *, param_bytes: int = 4,
                      mixed: bool = False) -> MemoryBytes:
    """The ZeRO paper's model-state bytes per rank for `n_params` (this rank's TP share).

    Parameters (param_bytes each) are divided by dp at stage 3, fp32 gradients (4 bytes; this
    engine accumulates in fp32) at stage >= 2, and the optimizer state (2 fp32 moments, plus an
    fp32 master copy when mixed) at stage >= 1.
    """
    optimizer = n_params * (8 + (4 if mixed else 0))
    return MemoryBytes(
        params=n_params * param_bytes // (dp if stage >= 3 else 1),
        grads=n_params * 4 // (dp if stage >= 2 else 1),
        optimizer=optimizer // (dp if stage >= 1 else 1),
    )


def _nbytes(t: torch.Tensor | None) -> int:
    return 0 if t is None else t.numel() * t.element_size()


def memory_report(engine: ZeroEngine) -> MemoryBytes:
    """Bytes this rank holds between steps, measured from the engine's own tensors."""
    params = grads = optimizer = 0
    for state in engine.states:
        params += _nbytes(state.param_shard) if engine.stage == 3 else _nbytes(state.full)
        grads += _nbytes(state.grad_shard if engine.stage >= 2 else state.grad)
        if not state.master_aliased:
            optimizer += _nbytes(state.master)
        for param, _, _, _ in state.opt_params:
            for value in engine.optimizer.state.get(param, {}).values():
                if isinstance(value, torch.Tensor) and value.numel() > 1:
                    optimizer += _nbytes(value)
    return MemoryBytes(params, grads, optimizer)


@dataclass(frozen=True)
class SavedActivations:
    """Bytes autograd keeps for backward after one forward (distinct storages counted once)."""

    total: int
    per_layer: list[int]
    """The part saved while inside each TransformerLayer's forward."""


def measure_saved_activations(model: torch.nn.Module, forward: Callable[[], torch.Tensor]) -> SavedActivations:
    """Run `forward()` (which returns the loss) under saved-tensor hooks, then its backward."""
    from tpformer.layers.block import TransformerLayer

    layers = [m for m in model.modules() if isinstance(m, TransformerLayer)]
    per_layer = [0] * len(layers)
    current: list[int] = []
    handles = []
    for i, layer in enumerate(layers):
        handles.append(layer.register_forward_pre_hook(lambda m, a, i=i: current.append(i)))
        handles.append(layer.register_forward_hook(lambda m, a, o: [current.pop()] and None))
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in seen:
            seen[storage.data_ptr()] = storage.nbytes()
            if current:
                per_layer[current[-1]] += storage.nbytes()
        return t

    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            loss = forward()
        loss.backward()
    finally:
        for handle in handles:
            handle.remove()
    return SavedActivations(sum(seen.values()), per_layer)
