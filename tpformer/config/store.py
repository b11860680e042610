"""Registers the schema in Hydra's ConfigStore: Config types config.yaml; presets fill `model`."""

from __future__ import annotations

from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import MissingMandatoryValue

from tpformer.config import CONF_DIR
from tpformer.config.presets import PRESETS
from tpformer.config.reference import key_docstring
from tpformer.config.schema import (
    Config,
    EvalLMConfig,
    FinetuneConfig,
    GenerateConfig,
    PlanConfig,
)
from tpformer.config.variant_groups import ON, variant_groups

__all__ = ["CONF_DIR", "register_configs", "to_config"]


def register_configs() -> None:
    """Idempotent: safe to call from every entry point and test."""
    cs = ConfigStore.instance()
    cs.store(name="base_config", node=Config)
    cs.store(name="base_finetune", node=FinetuneConfig)
    cs.store(name="base_plan", node=PlanConfig)
    cs.store(name="base_generate", node=GenerateConfig)
    cs.store(name="base_eval_lm", node=EvalLMConfig)
    for name, preset in PRESETS.items():
        cs.store(group="model", name=name, node=preset)
    for group, record in variant_groups().items():  # +model/rotary=on: config/variant_groups.py
        cs.store(group=f"model/{group}", name=ON, node=record)


def to_config(cfg: DictConfig) -> Any:
    """The typed config object (Config, FinetuneConfig or PlanConfig: the schema registered for
    the composed file) of a composed DictConfig; after this, nobody sees a DictConfig. A key
    without a default that was not given is one line naming it and what it takes."""
    try:
        return OmegaConf.to_object(cfg)
    except MissingMandatoryValue as err:
        key = str(err.full_key)
        meaning = key_docstring(key, OmegaConf.get_type(cfg) or Config)
        raise ValueError(f"{key} is required: give {key}=... ({meaning})") from None
