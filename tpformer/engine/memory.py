"""Per-rank bytes of model state (the ZeRO paper's formula, next to which the engine's own
memory_report is tested) and the activations autograd saves for backward."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from tpformer.engine.units import model_blocks


@dataclass(frozen=True)
class MemoryBytes:
    params: int
    grads: int
    optimizer: int
    """AdamW moments plus the fp32 master weights when they are a separate copy."""

    @property
    def total(self) -> int:
        return self.params + self.grads + self.optimizer


def zero_memory_bytes(
    stage: int,
    n_params: int,
    dp: int,
    *,
    param_bytes: int = 4,
    mixed: bool = False,
    grad_bytes: int = 4,
) -> MemoryBytes:
    """The ZeRO paper's model-state bytes per rank for `n_params` (this rank's TP share).

    Parameters (param_bytes each) are divided by dp at stage 3, gradients (grad_bytes each: 4,
    this engine accumulates in fp32; the paper's formula keeps 16-bit ones) at stage >= 2, and
    the optimizer state (2 fp32 moments, plus an fp32 master copy when mixed) at stage >= 1.
    """
    optimizer = n_params * (8 + (4 if mixed else 0))
    return MemoryBytes(
        params=n_params * param_bytes // (dp if stage >= 3 else 1),
        grads=n_params * grad_bytes // (dp if stage >= 2 else 1),
        optimizer=optimizer // (dp if stage >= 1 else 1),
    )


@dataclass(frozen=True)
class SavedActivations:
    """Bytes autograd keeps for backward after one forward (distinct storages counted once)."""

    total: int
    per_layer: list[int]
    """The part saved while inside each of the model's blocks' forward."""


def measure_saved_activations(
    model: torch.nn.Module, forward: Callable[[], torch.Tensor]
) -> SavedActivations:
    """Run `forward()` (which returns the loss) under saved-tensor hooks, then its backward."""
    layers = model_blocks(model)
    per_layer = [0] * len(layers)
    current: list[int] = []
    handles = []

    def leave(module: torch.nn.Module, args: object, output: object) -> None:
        current.pop()

    for i, layer in enumerate(layers):
        handles.append(layer.register_forward_pre_hook(lambda m, a, i=i: current.append(i)))
        handles.append(layer.register_forward_hook(leave))
    parameters = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in seen and storage.data_ptr() not in parameters:
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


def optimizer_state_bytes(optimizer: torch.optim.Optimizer, params: Sequence[torch.Tensor]) -> int:
    """Bytes of the optimizer's per-element state of `params` (scalars such as a step count
    are not counted)."""
    return sum(
        value.nbytes
        for p in params
        for value in optimizer.state.get(p, {}).values()
        if isinstance(value, torch.Tensor) and value.numel() > 1
    )
