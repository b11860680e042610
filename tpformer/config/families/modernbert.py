"""ModernBERT: the pre-norm encoder without biases, GeGLU, rotary positions, global attention
every third layer and a 128-token window in the others, MLM only (Warner et al., 2024)."""

from __future__ import annotations

from typing import Any

from tpformer.config.families.base import Family, encoder_rules
from tpformer.config.schema import (
    Activation,
    Arch,
    ClassifierPooling,
    LocalAttentionConfig,
    MlpConfig,
    ModelConfig,
    NormConfig,
    NormPosition,
    Pooler,
    RotaryConfig,
)


def _modernbert(
    layers: int, hidden: int, heads: int, ffn: int, window: int, **keys: Any
) -> ModelConfig:
    """Rotary base 160,000 globally and 10,000 locally, global attention every third layer, no
    segments, no dropout, a mean-pooled classifier head."""
    return ModelConfig(
        arch=Arch.bert,
        num_layers=layers,
        hidden_size=hidden,
        num_heads=heads,
        intermediate_size=ffn,
        type_vocab_size=0,
        dropout=0.0,
        attention_dropout=0.0,
        mlp=MlpConfig(activation=Activation.gelu, gated=True),
        norm=NormConfig(eps=1e-5, bias=False, position=NormPosition.pre),
        bias=False,
        rotary=RotaryConfig(theta=160000.0, local_theta=10000.0),
        local_attention=LocalAttentionConfig(window=window, global_every=3),
        pooler=Pooler.head,
        classifier_pooling=ClassifierPooling.mean,
        **keys,
    )


MODERNBERT = Family(
    name="modernbert",
    arch=Arch.bert,
    rotary=True,
    presets={
        "modernbert_tiny": _modernbert(4, 128, 4, 192, 32, max_position_embeddings=512),
        "modernbert_base": _modernbert(
            22, 768, 12, 1152, 128, vocab_size=50368, max_position_embeddings=8192
        ),
    },
    check=encoder_rules,
)
