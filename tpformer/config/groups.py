"""The config groups a command's config file lets `group=OPTION` choose, their options, and the
option it chooses by default: read from conf/<command>.yaml's defaults list and conf/<group>/
(and the model presets), for `--help` and for the checks that run before Hydra composes."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from tpformer.config import CONF_DIR
from tpformer.config.presets import PRESETS


def _defaults(config_name: str) -> list[dict]:
    """The defaults list of conf/`config_name`.yaml: its `group: option` entries."""
    from omegaconf import OmegaConf

    loaded = OmegaConf.to_container(OmegaConf.load(Path(CONF_DIR) / f"{config_name}.yaml"))
    entries = loaded.get("defaults", []) if isinstance(loaded, dict) else []
    return [e for e in entries if isinstance(e, dict)]


def selectable_groups(config_name: str) -> set[str]:
    """The groups the command's config file lets `group=OPTION` choose."""
    return {
        str(k)
        for entry in _defaults(config_name)
        for k in entry
        if not str(k).startswith("override")
    }


def default_option(config_name: str, group: str) -> str | None:
    """The option of `group` the command's config file chooses when none is given."""
    return next((str(e[group]) for e in _defaults(config_name) if group in e), None)


def group_options(group: str, config_dirs: Sequence[str] = ()) -> list[str]:
    """The options `group=NAME` selects: the YAML files of conf/<group>/ and of the user's
    `--config-dir`s (`config_dirs`), and the model presets."""
    folders = [Path(CONF_DIR), *(Path(d).expanduser() for d in config_dirs)]
    names = {p.stem for folder in folders for p in (folder / group).glob("*.yaml")}
    if group == "model":
        names |= set(PRESETS)
    return sorted(names)
