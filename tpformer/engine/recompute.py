"""Activation checkpointing applied to the blocks a built model names (torch.utils.checkpoint,
non-reentrant). It wraps any model with `blocks()`; it knows no layer class.

full       a checkpointed block keeps only its input; everything inside is recomputed in
           backward. Granularity: the first `recompute_num_layers` blocks (0 = all), every
           `recompute_every`-th of them.
selective  only what each block names in `selective_recompute_targets()` is recomputed: for a
           transformer layer the attention core (scores, softmax, dropout, probs @ v), which
           holds the b x heads x s x s tensors that dominate activation memory at long
           sequences and costs two batched matmuls to redo (Megatron's selective scheme).

Dropout masks are pure functions of the RNG tracker's position, which is saved at the forward
and restored around the recomputation, so recomputed masks equal the original ones bit for bit.
"""

from __future__ import annotations

from collections.abc import Callable

from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from tpformer.config.schema import ParallelConfig
from tpformer.engine.params import host_device
from tpformer.engine.units import model_blocks
from tpformer.engine.wrapping import wrap_method
from tpformer.parallel.random import RNGTracker, eager_island


def checkpointed_layer_indices(num_layers: int, num_checkpointed: int, every: int) -> list[int]:
    """Which blocks full recomputation wraps (granularity checked by the config validator)."""
    limit = num_checkpointed or num_layers
    return [i for i in range(limit) if i % every == 0]


def _recomputed(
    fn: Callable[..., Tensor], rng: RNGTracker, *, offload: bool
) -> Callable[..., Tensor]:
    """fn under non-reentrant checkpoint, replaying the RNG position of its forward."""

    def run(x: Tensor, *rest: Tensor | None) -> Tensor:
        state = rng.state_dict()
        device = x.device

        def replay(inner: Tensor, *inner_rest: Tensor | None) -> Tensor:
            if offload:  # the kept input lives on the CPU; compute on the original device
                inner = inner.to(device, non_blocking=True)
            with rng.restored(state):
                return fn(inner, *inner_rest)

        args = (x.to(host_device(device), non_blocking=True) if offload else x, *rest)
        return checkpoint(replay, *args, use_reentrant=False, preserve_rng_state=False)

    return run


def apply_recompute(model: nn.Module, parallel: ParallelConfig, rng: RNGTracker) -> list[str]:
    """Wrap the model's blocks (full) or their selective targets (engine/wrapping.py: each keeps
    its parameters and names).

    Returns the names of the wrapped modules and methods (shown in the startup plan and tested).
    """
    mode = parallel.recompute
    if mode == "none":
        return []
    names = {id(m): n for n, m in model.named_modules()}
    blocks = model_blocks(model)
    if mode == "selective":
        wrapped = []
        for block in blocks:
            for module, method in getattr(block, "selective_recompute_targets", list)():
                # called inside a block's forward, which trainer.compile compiles: kept eager
                wrap_method(
                    module,
                    method,
                    lambda fn: eager_island(_recomputed(fn, rng, offload=False)),
                    "Recomputed",
                )
                wrapped.append(f"{names[id(module)]}.{method}")
        return wrapped
    indices = checkpointed_layer_indices(
        len(blocks), parallel.recompute_num_layers, parallel.recompute_every
    )
    offload = parallel.recompute_offload
    for i in indices:
        wrap_method(
            blocks[i], "forward", lambda fn: _recomputed(fn, rng, offload=offload), "Recomputed"
        )
    return [names[id(blocks[i])] for i in indices]
