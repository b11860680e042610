"""Registers the schema in Hydra's ConfigStore: Config types config.yaml; presets fill `model`."""

from __future__ import annotations

from pathlib import Path

from hydra.core.config_store import ConfigStore
from omegaconf import DictConfig, OmegaConf

from tpformer.config.presets import PRESETS
from tpformer.config.schema import Config, FinetuneConfig, PlanConfig

CONF_DIR = str(Path(__file__).resolve().parents[2] / "conf")
"""Absolute, so console scripts and `python -m` find the same conf/ (editable install)."""


def register_configs() -> None:
    """Idempotent: safe to call from every entry point and test."""
    cs = ConfigStore.instance()
    cs.store(name="base_config", node=Config)
    cs.store(name="base_finetune", node=FinetuneConfig)
    cs.store(name="base_plan", node=PlanConfig)
    for name, preset in PRESETS.items():
        cs.store(group="model", name=name, node=preset)


def to_config(cfg: DictConfig) -> Config | FinetuneConfig:
    """The typed Config of a composed DictConfig; after this, nobody sees a DictConfig."""
    return OmegaConf.to_object(cfg)  # type: ignore[return-value]
