"""GPT-2: the pre-norm causal decoder with learned positions, gelu_tanh and an LM head tied
to the word embedding (Radford et al., 2019)."""

from __future__ import annotations

from tpformer.config.families.base import Family, decoder_rules
from tpformer.config.schema import (
    Activation,
    Arch,
    MlpConfig,
    ModelConfig,
    NormConfig,
    NormPosition,
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
        mlp=MlpConfig(activation=Activation.gelu_tanh),
        norm=NormConfig(eps=1e-5, position=NormPosition.pre),
    )


GPT2 = Family(
    name="gpt2",
    arch=Arch.gpt,
    rotary=False,
    presets={
        "gpt2_small": _gpt2(12, 768, 12),
        "gpt2_medium": _gpt2(24, 1024, 16),
        "gpt2_large": _gpt2(36, 1280, 20),
        "gpt2_xl": _gpt2(48, 1600, 25),
    },
    check=decoder_rules,
)
