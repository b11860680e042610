"""Registers the schema in Hydra's ConfigStore: Config types config.yaml; presets fill `model`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf

from tpformer.config.presets import PRESETS
from tpformer.config.schema import (
    Config,
    EvalLMConfig,
    FinetuneConfig,
    GenerateConfig,
    PlanConfig,
)

CONF_DIR = str(Path(__file__).resolve().parents[1] / "conf")
"""tpformer/conf, shipped inside the package (package data), so a wheel install finds it; the
repository's top-level conf/ is a link to it. Users add their own directories with Hydra's
--config-dir."""


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


def to_config(cfg: DictConfig) -> Any:
    """The typed config object (Config, FinetuneConfig or PlanConfig: the schema registered for
    the composed file) of a composed DictConfig; after this, nobody sees a DictConfig."""
    return OmegaConf.to_object(cfg)
