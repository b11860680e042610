"""The normalization a model config names: LayerNorm (with or without bias) or RMSNorm."""

from __future__ import annotations

from torch import nn

from tpformer.config.schema import ModelConfig


def make_norm(config: ModelConfig) -> nn.Module:
    """config.norm over the hidden size, with config's epsilon (and bias, for LayerNorm)."""
    if config.norm == "rmsnorm":
        return nn.RMSNorm(config.hidden_size, eps=config.layer_norm_eps)
    return nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps, bias=config.bias)
