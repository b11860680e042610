"""Model size presets (the names `model=<preset>` accepts): every family's, from the registry
(tpformer/config/families/)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from tpformer.config.families import FAMILIES
from tpformer.config.schema import ModelConfig

PRESETS: dict[str, ModelConfig] = {
    name: config for family in FAMILIES for name, config in family.presets.items()
}


def preset(name: str, **overrides: Any) -> ModelConfig:
    """A copy of preset `name` with fields overridden; unknown names list the valid ones."""
    if name not in PRESETS:
        raise ValueError(f"unknown model preset {name!r}; valid presets are {sorted(PRESETS)}")
    return replace(PRESETS[name], **overrides)
