"""Typed configuration: one dataclass per Hydra group."""

from pathlib import Path

CONF_DIR = str(Path(__file__).resolve().parents[1] / "conf")
"""tpformer/conf, shipped inside the package (package data), so a wheel install finds it; the
repository's top-level conf/ is a link to it. Users add their own directories with Hydra's
--config-dir. Defined here, not in config.store, so readers of its YAML files (the planner's
cluster presets) import without Hydra."""
