"""Activation checkpointing applied to built blocks (torch.utils.checkpoint, non-reentrant).

full       a checkpointed TransformerLayer keeps only its input; everything inside is
           recomputed in backward. Granularity: the first `checkpoint_num_layers` layers
           (0 = all), every `checkpoint_every`-th of them.
selective  only the attention core (scores, softmax, dropout, probs @ v) is recomputed: it holds
           the b x heads x s x s tensors that dominate activation memory at long sequences, and
           costs two batched matmuls to redo (Megatron's selective scheme).

Dropout masks are pure functions of the RNG tracker's position, which is saved at the forward
and restored around the recomputation, so recomputed masks equal the original ones bit for bit.
"""

from __future__ import annotations

from collections.abc import Callable

from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from tpformer.config.schema import ParallelConfig
from tpformer.layers.attention import ParallelSelfAttention
from tpformer.layers.block import TransformerLayer
from tpformer.parallel.random import RNGTracker

MODES = ("none", "selective", "full")


def checkpointed_layer_indices(num_layers: int, num_checkpointed: int, every: int) -> list[int]:
    """Which layers full recomputation wraps; raises on a granularity the model cannot have."""
    if num_checkpointed < 0 or num_checkpointed > num_layers:
        raise ValueError(f"parallel.checkpoint_num_layers={num_checkpointed} must be between 0 "
                         f"(all) and the model's num_layers={num_layers}")
    if every < 1 or every > num_layers:
        raise ValueError(f"parallel.checkpoint_every={every} must be between 1 and the model's "
                         f"num_layers={num_layers}")
    limit = num_checkpointed or num_layers
    return [i for i in range(limit) if i % every == 0]


def _recomputed(fn: Callable[..., Tensor], rng: RNGTracker, *, offload: bool) -> Callable[..., Tensor]:
    """fn under non-reentrant checkpoint, replaying the RNG position of its forward."""

    def run(*args: Tensor | None) -> Tensor:
        state = rng.state_dict()

        def replay(*inner: Tensor | None) -> Tensor:
            if offload:  # the kept input lives on the CPU; compute on the original device
                inner = (inner[0].to(device, non_blocking=True), *inner[1:])
            with rng.restored(state):
                return fn(*inner)

        device = args[0].device
        if offload:
            args = (args[0].to("cpu", non_blocking=True), *args[1:])
        return checkpoint(replay, *args, use_reentrant=False, preserve_rng_state=False)

    return run


def apply_recompute(model: nn.Module, parallel: ParallelConfig, rng: RNGTracker) -> list[str]:
    """Wrap the built model's layers (full) or attention cores (selective) in place.

    Returns the names of the wrapped modules (shown in the startup plan and tested).
    """
    mode = parallel.activation_checkpointing
    if mode not in MODES:
        raise ValueError(f"parallel.activation_checkpointing={mode!r} is not one of {list(MODES)}")
    layers = [(n, m) for n, m in model.named_modules() if isinstance(m, TransformerLayer)]
    if mode == "none":
        return []
    if mode == "selective":
        wrapped = []
        for name, module in model.named_modules():
            if isinstance(module, ParallelSelfAttention):
                module.core = _recomputed(module.core, rng, offload=False)  # type: ignore[method-assign]
                wrapped.append(f"{name}.core")
        return wrapped
    indices = checkpointed_layer_indices(len(layers), parallel.checkpoint_num_layers,
                                         parallel.checkpoint_every)
    for i in indices:
        layer = layers[i][1]
        layer.forward = _recomputed(layer.forward, rng, offload=parallel.checkpoint_offload)  # type: ignore[method-assign]
    return [layers[i][0] for i in indices]
