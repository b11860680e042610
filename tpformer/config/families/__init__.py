"""The model families: one unit each (presets, the rules of its keys, how a config is
recognized as it), in a registry every part of tpformer asks instead of inferring the family.

A family is a set of options of one of the two models tpformer builds (`model.arch`: the
encoder, bert, or the decoder, gpt): BERT and ModernBERT are encoders, GPT-2 and Llama
(with Mistral and Qwen2 as flavors) decoders. The Hugging Face side of each family (key map,
configs both ways, class names) is its adapter in tpformer/interop/families/. Adding a family:
a file here (a `Family` with its presets and rules), its adapter there, a line in each
registry, and a test (docs/architecture.md, "Model families").
"""

from __future__ import annotations

from tpformer.config.families.base import Family
from tpformer.config.families.bert import BERT
from tpformer.config.families.gpt2 import GPT2
from tpformer.config.families.llama import LLAMA
from tpformer.config.families.modernbert import MODERNBERT
from tpformer.config.schema import ModelConfig

FAMILIES: tuple[Family, ...] = (BERT, GPT2, MODERNBERT, LLAMA)
"""Every family, in the order their presets are listed."""


def family_of(model: ModelConfig) -> Family:
    """The one family `model` belongs to (each family recognizes its own configs)."""
    found = [f for f in FAMILIES if f.recognizes(model)]
    if len(found) != 1:
        raise ValueError(
            f"model.arch={model.arch} with model.rotary={'set' if model.rotary else 'null'} "
            f"matches the families {[f.name for f in found]}; one of "
            f"{[f.name for f in FAMILIES]} expected"
        )
    return found[0]


def family_named(name: str) -> Family:
    """The family called `name`; an unknown name lists the known ones."""
    for family in FAMILIES:
        if family.name == name:
            return family
    raise ValueError(f"unknown model family {name!r}; known: {[f.name for f in FAMILIES]}")


__all__ = ["FAMILIES", "Family", "family_named", "family_of"]
