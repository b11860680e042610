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


def warmup_steps(optim: OptimConfig, max_steps: int) -> int:
    """optim.warmup_steps when given, else optim.warmup_ratio of the run's steps (rounded as
    Megatron does, or up as transformers' Trainer does, by optim.warmup_style)."""
    if optim.warmup_steps is not None:
        return optim.warmup_steps
    if optim.warmup_style == "transformers":
        return math.ceil(optim.warmup_ratio * max_steps)
    return round(optim.warmup_ratio * max_steps)


def lr_at(step: int, *, peak: float, optim: OptimConfig, max_steps: int) -> float:
    """The learning rate of optimizer step `step` (0-based)."""
    warmup = warmup_steps(optim, max_steps)
    if step < warmup:
        first = 0 if optim.warmup_style == "transformers" else 1
        return peak * (step + first) / warmup
    span = max(1, max_steps - warmup)
    progress = min(1.0, (step - warmup) / span)
    if optim.decay == "cosine":
        factor = 0.5 * (1.0 + math.cos(math.pi * progress))
    else:
        factor = 1.0 - progress
    return optim.min_lr + (peak - optim.min_lr) * factor
