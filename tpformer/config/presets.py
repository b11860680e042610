"""Model size presets (the names `model=<preset>` accepts)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from tpformer.config.schema import (
    Activation,
    Arch,
    ClassifierPooling,
    ModelConfig,
    Norm,
    Pooler,
    PositionEmbedding,
    RopeScaling,
)


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


def _llama(
    layers: int, hidden: int, heads: int, kv_heads: int, ffn: int, vocab: int, **keys: Any
) -> ModelConfig:
    """The Llama family's decoder: rotary positions, RMSNorm, SwiGLU, grouped-query
    attention, no biases, an untied LM head, no dropout."""
    return ModelConfig(
        arch=Arch.gpt,
        vocab_size=vocab,
        num_layers=layers,
        hidden_size=hidden,
        num_heads=heads,
        num_kv_heads=kv_heads,
        intermediate_size=ffn,
        type_vocab_size=0,
        dropout=0.0,
        attention_dropout=0.0,
        activation=Activation.silu,
        gated_mlp=True,
        norm=Norm.rmsnorm,
        layer_norm_eps=1e-5,
        bias=False,
        tie_embeddings=False,
        position_embedding=PositionEmbedding.rope,
        **keys,
    )


def _modernbert(layers: int, hidden: int, heads: int, ffn: int, **keys: Any) -> ModelConfig:
    """ModernBERT's encoder: pre-norm without biases, GeGLU, rotary positions (base 160,000
    globally, 10,000 locally), global attention every third layer and a 128-token window in the
    others, no segments, no dropout, MLM only with a mean-pooled classifier head."""
    shape: dict[str, Any] = {"local_window": 128, **keys}
    return ModelConfig(
        arch=Arch.bert,
        num_layers=layers,
        hidden_size=hidden,
        num_heads=heads,
        intermediate_size=ffn,
        type_vocab_size=0,
        dropout=0.0,
        attention_dropout=0.0,
        activation=Activation.gelu,
        gated_mlp=True,
        layer_norm_eps=1e-5,
        bias=False,
        pre_norm=True,
        position_embedding=PositionEmbedding.rope,
        rope_theta=160000.0,
        local_rope_theta=10000.0,
        global_every=3,
        pooler=Pooler.head,
        classifier_pooling=ClassifierPooling.mean,
        **shape,
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
    "modernbert_tiny": _modernbert(4, 128, 4, 192, local_window=32, max_position_embeddings=512),
    "modernbert_base": _modernbert(
        22, 768, 12, 1152, vocab_size=50368, max_position_embeddings=8192
    ),
    "llama_tiny": _llama(2, 128, 4, 2, 352, 32000, max_position_embeddings=512),
    "llama2_7b": _llama(32, 4096, 32, 32, 11008, 32000, max_position_embeddings=4096),
    "llama3_8b": _llama(
        32,
        4096,
        32,
        8,
        14336,
        128256,
        max_position_embeddings=131072,
        rope_theta=500000.0,
        rope_scaling=RopeScaling.llama3,
        rope_factor=8.0,
        rope_original_max_positions=8192,
    ),  # fmt: skip (Llama 3.1 8B)
}


def preset(name: str, **overrides: Any) -> ModelConfig:
    """A copy of preset `name` with fields overridden; unknown names list the valid ones."""
    if name not in PRESETS:
        raise ValueError(f"unknown model preset {name!r}; valid presets are {sorted(PRESETS)}")
    return replace(PRESETS[name], **overrides)
