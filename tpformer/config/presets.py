"""Model size presets (the names `model=<preset>` accepts)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from tpformer.config.schema import Activation, Arch, ModelConfig


def _bert(layers: int, hidden: int, heads: int) -> ModelConfig:
    return ModelConfig(
        arch=Arch.bert,
        num_layers=layers,
        hidden_size=hidden,
        num_heads=heads,
        intermediate_size=4 * hidden,
    )


def _gpt2(layers: int, hidden: int, heads: int) -> ModelConfig:
    return ModelConfig(
        arch=Arch.gpt,
        vocab_size=50257,
        num_layers=layers,
        hidden_size=hidden,
        num_heads=heads,
        intermediate_size=4 * hidden,
        max_position_embeddings=1024,
        type_vocab_size=0,
        activation=Activation.gelu_tanh,
        layer_norm_eps=1e-5,
    )


PRESETS: dict[str, ModelConfig] = {
    "bert_tiny": _bert(2, 128, 2),
    "bert_mini": _bert(4, 256, 4),
    "bert_small": _bert(4, 512, 8),
    "bert_medium": _bert(8, 512, 8),
    "bert_base": _bert(12, 768, 12),
    "bert_large": _bert(24, 1024, 16),
    "gpt2_small": _gpt2(12, 768, 12),
    "gpt2_medium": _gpt2(24, 1024, 16),
    "gpt2_large": _gpt2(36, 1280, 20),
    "gpt2_xl": _gpt2(48, 1600, 25),
}


def preset(name: str, **overrides: Any) -> ModelConfig:
    """A copy of preset `name` with fields overridden; unknown names list the valid ones."""
    if name not in PRESETS:
        raise ValueError(f"unknown model preset {name!r}; valid presets are {sorted(PRESETS)}")
    return replace(PRESETS[name], **overrides)
