"""The Hugging Face adapters of the model families (tpformer/config/families/), one file each,
and the questions the rest of tpformer asks them: which adapter a config or a config.json
belongs to, the configs both ways."""

from __future__ import annotations

from typing import Any

from tpformer.config.families import family_of
from tpformer.config.schema import ModelConfig
from tpformer.interop.families.base import HFAdapter
from tpformer.interop.families.bert import BERT_HF
from tpformer.interop.families.gpt2 import GPT2_HF
from tpformer.interop.families.llama import LLAMA_HF
from tpformer.interop.families.modernbert import MODERNBERT_HF

ADAPTERS: tuple[HFAdapter, ...] = (BERT_HF, GPT2_HF, LLAMA_HF, MODERNBERT_HF)

SUPPORTED: dict[str, str] = {c: task for a in ADAPTERS for c, task in a.classes.items()}
"""Every HF class tpformer reads -> the task it builds."""


def adapter_of(config: ModelConfig) -> HFAdapter:
    """The adapter of `config`'s family."""
    family = family_of(config)
    return next(a for a in ADAPTERS if a.family is family)


def adapter_for(hf: dict) -> HFAdapter:
    """The adapter that reads a config.json of this model_type; others are refused by name."""
    kind = hf.get("model_type")
    for adapter in ADAPTERS:
        if kind in adapter.defaults:
            return adapter
    known = [k for a in ADAPTERS for k in a.defaults]
    raise ValueError(f"model_type={kind!r} is not supported; supported: {known}")


def model_config_from_hf(hf: dict) -> ModelConfig:
    """ModelConfig from a HF config.json dict, through its family's adapter."""
    return adapter_for(hf).config_from_hf(hf)


def hf_config_from_model(config: ModelConfig, architecture: str, **extra: Any) -> Any:
    """A transformers config object for `config` (export), through its family's adapter."""
    return adapter_of(config).config_to_hf(config, architecture, **extra)


__all__ = [
    "ADAPTERS",
    "SUPPORTED",
    "HFAdapter",
    "adapter_for",
    "adapter_of",
    "hf_config_from_model",
    "model_config_from_hf",
]
