"""What a model family is: its name, the model that builds it, how a config is recognized as
one of its, its presets and the rules of its keys."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from tpformer.config.schema import Arch, ModelConfig, NormPosition


def _no_rules(model: ModelConfig) -> None:
    """A family without rules of its own beyond the model group's."""


@dataclass(frozen=True)
class Family:
    """One model family.

    `arch`: the model that builds it (the encoder or the decoder); `rotary`: whether its
    configs carry rotary positions (with `arch`, how a config is recognized); `presets`: the
    `model=<name>` configs it offers; `check`: its rules, raising ValueError with the key and
    what would be valid (the model group's rules call it after the shape rules)."""

    name: str
    arch: Arch
    rotary: bool
    presets: dict[str, ModelConfig] = field(default_factory=dict)
    check: Callable[[ModelConfig], None] = _no_rules

    def recognizes(self, model: ModelConfig) -> bool:
        """Whether `model` is one of this family's configs."""
        return model.arch == self.arch and (model.rotary is not None) == self.rotary


def encoder_rules(model: ModelConfig) -> None:
    """The encoder's (BERT's and ModernBERT's): a tied MLM head, and the first token for the
    tanh pooler."""
    if not model.tie_embeddings:
        raise ValueError(
            "model.tie_embeddings=false is built for arch=gpt; BERT's MLM head is tied"
        )
    if model.pooler == "tanh" and model.classifier_pooling != "cls":
        raise ValueError(
            f"model.classifier_pooling={model.classifier_pooling} needs model.pooler=head: "
            "BERT's tanh pooler reads the first token only"
        )


def decoder_rules(model: ModelConfig) -> None:
    """The decoder's (GPT-2's and Llama's): pre-norm, no encoder keys (a window, a pooler)."""
    if model.local_attention is not None:
        raise ValueError(
            f"model.local_attention (window {model.local_attention.window}) is built for "
            "arch=bert (ModernBERT's bidirectional window); a decoder's sliding window (Mistral) "
            "is not built: set model.local_attention=null"
        )
    if model.norm.position != NormPosition.pre:
        raise ValueError(
            f"model.norm.position={model.norm.position}: a decoder (arch=gpt) is built pre-norm "
            "only; set model.norm.position=pre"
        )
    if model.pooler != "tanh" or model.classifier_pooling != "cls":
        raise ValueError(
            "model.pooler and model.classifier_pooling are encoder (arch=bert) keys: a decoder "
            "has no pooler; leave them at their defaults"
        )
