"""BERT: the post-norm encoder with learned positions, segments, a tanh pooler and the NSP/SOP
pair head (Devlin et al., 2019)."""

from __future__ import annotations

from tpformer.config.families.base import Family, encoder_rules
from tpformer.config.schema import Arch, ModelConfig


def _bert(layers: int, hidden: int, heads: int) -> ModelConfig:
    return ModelConfig(
        arch=Arch.bert,
        num_layers=layers,
        hidden_size=hidden,
        num_heads=heads,
        intermediate_size=4 * hidden,
    )


BERT = Family(
    name="bert",
    arch=Arch.bert,
    rotary=False,
    presets={
        "bert_tiny": _bert(2, 128, 2),
        "bert_mini": _bert(4, 256, 4),
        "bert_small": _bert(4, 512, 8),
        "bert_medium": _bert(8, 512, 8),
        "bert_base": _bert(12, 768, 12),
        "bert_large": _bert(24, 1024, 16),
    },
    check=encoder_rules,
)
