"""Learning-rate schedule: linear warmup, then linear or cosine decay to min_lr at max_steps."""

from __future__ import annotations

import math

from tpformer.config.schema import OptimConfig


def scaled_lr(optim: OptimConfig, global_batch: int) -> float:
    """optim.lr, scaled with the global batch by the linear or square-root rule if asked."""
    ratio = global_batch / optim.base_batch_size
    if optim.lr_scaling == "linear":
        return optim.lr * ratio
    if optim.lr_scaling == "sqrt":
        return optim.lr * math.sqrt(ratio)
    return optim.lr


def lr_at(step: int, *, peak: float, optim: OptimConfig, max_steps: int) -> float:
    """The learning rate of optimizer step `step` (0-based)."""
    if step < optim.warmup_steps:
        return peak * (step + 1) / optim.warmup_steps
    span = max(1, max_steps - optim.warmup_steps)
    progress = min(1.0, (step - optim.warmup_steps) / span)
    if optim.decay == "cosine":
        factor = 0.5 * (1.0 + math.cos(math.pi * progress))
    else:
        factor = 1.0 - progress
    return optim.min_lr + (peak - optim.min_lr) * factor
