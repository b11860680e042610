"""`--help` of the Hydra console scripts, from the schema: what the command does, the config
groups it takes with their options, and each key with its default, its allowed values and the
docstring written under the field (the same source as the docs' configuration reference).
`--help GROUP` narrows it to one group."""

from __future__ import annotations

import dataclasses
import shutil
import sys
import textwrap
import typing
from typing import Any

from tpformer.config import CONF_DIR
from tpformer.config.groups import group_options, selectable_groups
from tpformer.config.reference import (
    allowed_values,
    default_of,
    field_docstrings,
    format_value,
    optional_record,
)


def _groups(schema: type) -> dict[str, type]:
    """The schema's fields that are config groups (dataclasses), by name."""
    hints = typing.get_type_hints(schema)
    return {
        f.name: hints[f.name]
        for f in dataclasses.fields(schema)
        if isinstance(hints[f.name], type) and dataclasses.is_dataclass(hints[f.name])
    }


def composed(config_name: str, overrides: list[str]) -> Any:
    """The command's config as the run would compose it (its default presets and options, the
    `overrides` over them), or None when it does not compose (help then shows the schema's
    defaults; the run itself names the problem)."""
    from hydra import compose, initialize_config_dir

    from tpformer.config.store import register_configs

    register_configs()
    try:
        with initialize_config_dir(config_dir=CONF_DIR, version_base=None):
            return compose(config_name, overrides=overrides)
    except Exception:
        return None


def _value(node: Any, f: dataclasses.Field[Any]) -> str:
    """A key's value in the composed `node` of its group (the schema default without one)."""
    from omegaconf import OmegaConf

    if node is None:
        return format_value(default_of(f))
    if OmegaConf.is_missing(node, f.name):
        return "required"
    value = node[f.name]
    if OmegaConf.is_config(value):
        value = OmegaConf.to_container(value)
    return format_value(value)


def _child(node: Any, name: str) -> Any:
    """The composed group or section `name` of `node` (None without one, or when missing)."""
    from omegaconf import OmegaConf

    if node is None or OmegaConf.is_missing(node, name):
        return None
    value = node[name]
    return value if OmegaConf.is_config(value) else None


def _keys(cls: type, prefix: str, width: int, node: Any = None) -> list[str]:
    """Each key of `cls` with the value the run would take (`node`: its composed group)."""
    docs = field_docstrings(cls)
    lines = []
    for f in dataclasses.fields(cls):
        hint = typing.get_type_hints(cls)[f.name]
        child = _child(node, f.name)
        if isinstance(hint, type) and dataclasses.is_dataclass(hint):
            if prefix:  # a section of a group (trainer.profile): its keys in line
                lines += _keys(hint, f"{prefix}{f.name}.", width, child)
            continue  # at the top level, a group: listed on its own
        record = optional_record(hint)
        shown = "null" if record and child is None else "set" if record else _value(node, f)
        head = f"  {prefix}{f.name} = {shown}"
        values = "a group or null" if record else allowed_values(cls, f).replace("`", "")
        meaning = " ".join(docs.get(f.name, "").split())
        lines += textwrap.wrap(f"{head}  ({values})", width, subsequent_indent="        ")
        lines += textwrap.wrap(meaning, width, initial_indent="      ", subsequent_indent="      ")
        if record is not None:  # a variant group (model.rotary): its keys in line
            lines += _keys(record, f"{prefix}{f.name}.", width, child)
    return lines


def schema_help(
    command: str,
    description: str,
    schema: type,
    config_name: str,
    only: str | None = None,
    overrides: list[str] | None = None,
) -> str:
    """The help text of `command` (whose config is `schema`, composed from conf/`config_name`
    .yaml), or of its group `only`, with the values the run would take (the config file's
    default presets and options, and `overrides`)."""
    run = composed(config_name, list(overrides or []))
    width = max(60, min(100, shutil.get_terminal_size().columns)) - 2
    groups = _groups(schema)
    selectable = selectable_groups(config_name)
    if only is not None and only not in groups:
        raise ValueError(
            f"--help {only}: {command} has no config group {only}; its groups: "
            f"{', '.join(sorted(groups))}"
        )
    out = [] if only else [description.strip(), ""]
    if not only:
        out += [
            f"usage: {command} [GROUP=OPTION ...] [GROUP.KEY=VALUE ...]",
            f"       {command} --help GROUP   (one group's keys)",
            "",
        ]
        own = _keys(schema, "", width, run)
        if own:
            out += ["keys:", *own, ""]
    for name, cls in groups.items():
        if only and name != only:
            continue
        options = group_options(name) if name in selectable else []
        head = f"{name}=OPTION, one of: {', '.join(options)}" if options else f"{name}:"
        out += [*textwrap.wrap(head, width, subsequent_indent="    ")]
        out += [*_keys(cls, f"{name}.", width, run[name] if run is not None else None), ""]
    return "\n".join(out).rstrip() + "\n"


def given_overrides(argv: list[str]) -> list[str]:
    """The key=value overrides of a command line (not its flags), which --help composes."""
    return [a for a in argv if "=" in a and not a.startswith("-")]


def help_requested(argv: list[str]) -> tuple[bool, str | None]:
    """(whether argv asks for --help / -h, the group named after it if any)."""
    for i, arg in enumerate(argv):
        if arg in ("--help", "-h"):
            following = argv[i + 1] if i + 1 < len(argv) else None
            return True, following if following and "=" not in following else None
    return False, None


def print_help_and_exit(
    command: str, description: str, schema: type, config_name: str, argv: list[str]
) -> None:
    """If argv asks for help, print it and exit 0."""
    wanted, group = help_requested(argv)
    if wanted:
        overrides = given_overrides(argv)
        print(schema_help(command, description, schema, config_name, group, overrides), end="")
        sys.exit(0)
