"""Llama: the decoder with rotary positions, RMSNorm, SwiGLU, grouped-query attention, no
biases and an untied LM head (Touvron et al., 2023). Mistral (without its sliding window) and
Qwen2 (biases on the query, key and value projections: model.qkv_bias) are its flavors: the
same blocks, other Hugging Face class names (tpformer/interop/families/llama.py)."""

from __future__ import annotations

from typing import Any

from tpformer.config.families.base import Family, decoder_rules
from tpformer.config.schema import (
    Activation,
    Arch,
    MlpConfig,
    ModelConfig,
    Norm,
    NormConfig,
    NormPosition,
    RopeScaling,
    RotaryConfig,
)


def _llama(
    layers: int,
    hidden: int,
    heads: int,
    kv_heads: int,
    ffn: int,
    vocab: int,
    rotary: RotaryConfig | None = None,
    **keys: Any,
) -> ModelConfig:
    """No dropout."""
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
        mlp=MlpConfig(activation=Activation.silu, gated=True),
        norm=NormConfig(kind=Norm.rmsnorm, eps=1e-5, bias=False, position=NormPosition.pre),
        bias=False,
        tie_embeddings=False,
        rotary=rotary or RotaryConfig(),
        **keys,
    )


LLAMA = Family(
    name="llama",
    arch=Arch.gpt,
    rotary=True,
    presets={
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
            rotary=RotaryConfig(
                theta=500000.0,
                scaling=RopeScaling.llama3,
                factor=8.0,
                original_max_positions=8192,
            ),
        ),  # fmt: skip (Llama 3.1 8B)
    },
    check=decoder_rules,
)
