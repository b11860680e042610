"""The optim group: optimizer, schedule and the loss scaler."""

from __future__ import annotations

from dataclasses import dataclass

from tpformer.config.schema.choices import Decay, LrScaling, OptimizerName, WarmupStyle, ranged


@dataclass
class OptimConfig:
    """Optimizer, clipping and loss-scaling settings the engine applies."""

    name: OptimizerName = OptimizerName.adamw
    """adamw; lamb or lars (per-parameter trust ratios, for large-batch training); novograd
    (per-layer second moment). Biases and LayerNorms are not decayed."""
    lr: float = ranged(5e-4, 0, lo_open=True)
    """Peak learning rate. 5e-4 suits the small presets at the default global batch of 8;
    BERT-base/large at batch 256 use 1e-4 (or set optim.lr_scaling)."""
    weight_decay: float = ranged(0.01, 0)
    """Decoupled weight decay; biases and LayerNorm parameters are not decayed."""
    beta1: float = ranged(0.9, 0, 1, hi_open=True)
    """First-moment decay (AdamW, LAMB, NovoGrad)."""
    beta2: float = ranged(0.999, 0, 1, hi_open=True)
    """Second-moment decay (AdamW, LAMB, NovoGrad)."""
    eps: float = ranged(1e-8, 0, lo_open=True)
    """Added to the denominator (AdamW, LAMB, NovoGrad)."""
    momentum: float = ranged(0.9, 0, 1, hi_open=True)
    """lars: heavy-ball momentum."""
    trust_coefficient: float = ranged(0.001, 0, lo_open=True)
    """lars: eta in the trust ratio eta x ||w|| / (||g|| + weight_decay x ||w||)."""
    clip_grad: float = ranged(1.0, 0)
    """Clip the global gradient norm (over TP and DP) to this; 0 turns clipping off."""
    initial_loss_scale: float = ranged(65536.0, 1)
    """fp16 only: starting loss scale; halved on inf/nan, doubled after loss_scale_window clean
    steps."""
    loss_scale_window: int = ranged(1000, 1)
    """fp16 only: clean steps before the loss scale doubles."""
    max_nonfinite_steps: int = ranged(10, 1)
    """Stop with an error after this many consecutive steps with non-finite gradients."""
    warmup_ratio: float = ranged(0.1, 0, 1)
    """Linear warmup from 0 to lr over this fraction of the run's optimizer steps."""
    warmup_steps: int | None = ranged(None, 0)
    """Warmup steps given explicitly; overrides warmup_ratio when set (0: no warmup)."""
    warmup_style: WarmupStyle = WarmupStyle.megatron
    """megatron: round(warmup_ratio x steps) warmup steps, step s (0-based) at lr x (s+1) /
    warmup, so the first step trains; transformers: ceil(warmup_ratio x steps), step s at
    lr x s / warmup (the first at 0), as get_linear_schedule_with_warmup under Trainer. The
    decay after the warmup is the same."""
    decay: Decay = Decay.linear
    """linear or cosine decay from lr to min_lr at trainer.max_steps."""
    min_lr: float = ranged(0.0, 0)
    """Learning rate at the end of the decay."""
    lr_scaling: LrScaling = LrScaling.none
    """none, linear or sqrt: scale lr by (global batch / base_batch_size) or its square root."""
    base_batch_size: int = ranged(256, 1)
    """The global batch size `lr` was tuned for (used by lr_scaling)."""
