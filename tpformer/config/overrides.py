"""Override keys checked against the schema before Hydra composes: a typo or a `+key` the
schema does not have exits 2 with one line naming the closest valid key, instead of Hydra's
multi-line message and its advice to append the key with `+` (which Hydra then accepts and
the run ignores)."""

from __future__ import annotations

import dataclasses
import difflib
import enum
import functools
import sys
import typing
from collections.abc import Callable, Sequence
from typing import Any

from tpformer.config.reference import record_of

SKIPPED_PREFIXES = ("hydra", "+hydra", "++hydra")
"""Hydra's own keys (hydra.run.dir, hydra/launcher=...) are Hydra's to check."""


def unknown_key(key: str, schema: type) -> str | None:
    """Why `key` (dotted) is not a key of `schema`, naming the closest valid one; None if it is
    one (or descends into a field that is not a config group: a list or dict value)."""
    cls: type | None = schema
    path: list[str] = []
    parts = key.split(".")
    for i, part in enumerate(parts):
        if cls is None:
            return None
        hints = typing.get_type_hints(cls)
        names = [f.name for f in dataclasses.fields(cls)]
        if part not in names:
            where = ".".join(path)
            close = difflib.get_close_matches(part, names, n=1, cutoff=0.6)
            prefix = f"{where}." if where else ""
            rest = "".join(f".{p}" for p in parts[i + 1 :])
            valid = (
                f"did you mean {prefix}{close[0]}{rest}?"
                if close
                else f"the keys of {where or 'the config'} are {', '.join(sorted(names))}"
            )
            return f"{key} is not a config key; {valid}"
        path.append(part)
        cls = record_of(hints[part])
    return None


def _field_type(key: str, schema: type) -> Any:
    """The type hint of a dotted key of `schema` (None if it is not one)."""
    cls: Any = schema
    hint: Any = None
    for part in key.split("."):
        if cls is None or part not in {f.name for f in dataclasses.fields(cls)}:
            return None
        hint = typing.get_type_hints(cls)[part]
        cls = record_of(hint)
    return hint


def invalid_choice(key: str, value: str, schema: type) -> str | None:
    """Why `value` is not one of a choice key's values (one line naming them), else None. Sweeps
    (a,b), interpolations and quoted values are left to Hydra."""
    hint = _field_type(key, schema)
    if not (isinstance(hint, type) and issubclass(hint, enum.Enum)):
        return None
    if any(c in value for c in ",${}'\"[]()") or value in ("null", ""):
        return None
    valid = [str(m.value) for m in hint]
    if value in valid:
        return None
    return f"{key}={value} is not one of {', '.join(valid)}"


def _list_item_class(hint: Any) -> type | None:
    """The dataclass of a list-of-dataclasses field (data.blend's BlendPart), else None."""
    if typing.get_origin(hint) is not list:
        return None
    return record_of(typing.get_args(hint)[0]) if typing.get_args(hint) else None


def invalid_list_items(key: str, value: str, schema: type) -> str | None:
    """Why an item of a list-of-dataclasses override ([{k: v, ...}, ...]) has a key its class
    lacks or a choice value it does not allow (one line naming the closest valid key or the
    values), else None; Hydra's own message would advise appending with `+`."""
    item_class = _list_item_class(_field_type(key, schema))
    if item_class is None:
        return None
    from hydra.core.override_parser.overrides_parser import OverridesParser

    items = OverridesParser.create().parse_override(f"{key}={value}").value()
    for number, item in enumerate(items if isinstance(items, list) else []):
        if not isinstance(item, dict):
            return f"{key}: item {number} is {item!r}, expected {{key: value, ...}}"
        for field, field_value in item.items():
            where = f"{key}[{number}].{field}"
            problem = unknown_key(field, item_class)
            if problem is None and isinstance(field_value, str):
                problem = invalid_choice(field, field_value, item_class)
            if problem is not None:  # it starts with the field's name
                return where + problem[len(field) :]
    return None


def config_dirs(argv: list[str]) -> list[str]:
    """The folders `--config-dir DIR` (`-cd DIR`, `--config-dir=DIR`) adds to Hydra's search
    path, whose YAML files are options of their groups too."""
    dirs = []
    for i, arg in enumerate(argv):
        if arg in ("--config-dir", "-cd") and i + 1 < len(argv):
            dirs.append(argv[i + 1])
        elif arg.startswith("--config-dir="):
            dirs.append(arg.partition("=")[2])
    return dirs


def invalid_group_value(
    key: str, value: str, schema: type, config_name: str, dirs: list[str] | None = None
) -> str | None:
    """Why `key=value` cannot set the group `key` (one line), else None: a name that is not
    one of a selectable group's options (the closest named), or a plain value given to a
    group of keys without options (tpformer-finetune's model, trainer.profile). Hydra's own
    answers are many lines, and advise `+key`, which fails next."""
    from tpformer.config.groups import group_options, selectable_groups

    hint = _field_type(key, schema)
    listed = typing.get_origin(hint) is list  # a list of records (data.blend) takes a list
    record = record_of(hint) if hint is not None and not listed else None
    if record is None or value == "null" or value.startswith(("{", "$")):
        return None
    if "." not in key and key in selectable_groups(config_name):
        options = group_options(key, dirs or [])
        if value in options or any(c in value for c in ",'\"()"):  # a sweep: Hydra's
            return None
        close = difflib.get_close_matches(value, options, n=1, cutoff=0.6)
        guess = f"did you mean {key}={close[0]}? " if close else ""
        return f"{key}={value} is not one of its options; {guess}the options: {', '.join(options)}"
    keys = ", ".join(f"{key}.{f.name}" for f in dataclasses.fields(record))
    return f"{key}={value}: {key} is a group of keys, not a value; set them one by one: {keys}"


def quoted_override(key: str, value: str) -> str:
    """key=value as typed in a POSIX shell so that Hydra reads `value` as one string."""
    if "'" not in value:
        return f"""'{key}="{value}"'"""
    escaped = value.replace("\\", "\\\\").replace('"', '\\"')
    return f'"{key}=\\"{escaped}\\""'


def unparsable(override: str, *, multirun: bool) -> str | None:
    """Why Hydra's override grammar would refuse `override` (or read a comma in a plain value as
    a sweep outside --multirun), with the quoting that makes it one value; None if it parses."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    key, _, value = override.partition("=")
    quoted = quoted_override(key, value)
    try:
        parsed = OverridesParser.create().parse_override(override)
    except HydraException:  # the grammar's errors, OverrideParseException among them
        return (
            f"{override}: Hydra cannot read this value (commas, brackets, parentheses, quotes "
            f"and spaces have meanings in an override); quote it for the shell and Hydra: {quoted}"
        )
    if parsed.is_sweep_override() and not multirun:
        return (
            f"{override}: Hydra reads the commas as a sweep over several values; for one value "
            f"quote it: {quoted}; for a list: {key}=[a,b]; for a sweep add --multirun"
        )
    return None


def check_overrides(overrides: list[str], schema: type, config_name: str = "config") -> None:
    """Raise ValueError for the first override whose key `schema` does not have: key=value,
    +key=value (adding a key the schema lacks is refused, not ignored), ~key; or whose value
    Hydra's grammar cannot read as one value; or that sets a model variant group Hydra cannot
    (config/variant_groups.py; `config_name`: the command's config file, whose model preset is
    the default). Flags (--help, -m, --config-dir DIR) and Hydra's own keys are left to
    Hydra."""
    from tpformer.config.schema import ModelConfig
    from tpformer.config.variant_groups import check_variant_overrides

    if typing.get_type_hints(schema).get("model") is ModelConfig:
        check_variant_overrides(overrides, config_name)
    multirun = any(a in ("-m", "--multirun") for a in overrides)
    for override in overrides:
        if override.startswith("-") or ("=" not in override and not override.startswith("~")):
            continue
        key = override.split("=", 1)[0].lstrip("+~")
        if override.startswith(SKIPPED_PREFIXES) or key.startswith("hydra") or "/" in key:
            continue
        problem = unknown_key(key, schema)
        if problem is None and "=" in override:
            problem = unparsable(override, multirun=multirun)
        if problem is None and "=" in override:
            problem = invalid_choice(key, override.split("=", 1)[1], schema)
        if problem is None and "=" in override:
            problem = invalid_list_items(key, override.split("=", 1)[1], schema)
        if problem is None and "=" in override and not override.startswith("~"):
            value = override.split("=", 1)[1]
            searched = not any(o.lstrip("+").startswith("hydra.searchpath") for o in overrides)
            if searched:  # a search path named by override adds options this cannot see
                problem = invalid_group_value(
                    key, value, schema, config_name, config_dirs(overrides)
                )
        if problem is not None:
            raise ValueError(problem)


def checked_overrides(
    schema: type, command: str, description: str, config_name: str
) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Decorate a Hydra main: `--help [GROUP]` prints the schema's help (config/help.py), and
    the command-line overrides are checked against `schema` before Hydra composes."""

    def decorate(main: Callable[..., None]) -> Callable[..., None]:
        @functools.wraps(main)
        def wrapped(*args: Any, **kwargs: Any) -> None:
            from tpformer.config.help import print_help_and_exit

            print_help_and_exit(command, description, schema, config_name, sys.argv[1:])
            check_overrides(sys.argv[1:], schema, config_name)
            main(*args, **kwargs)

        return wrapped

    return decorate


def compose_typed(config_name: str, schema: type, overrides: Sequence[str]) -> Any:
    """The typed config a command composes from `overrides` (its Hydra file `config_name`),
    the overrides checked against `schema` first (a typo is one line)."""
    from hydra import compose, initialize_config_dir

    from tpformer.config import CONF_DIR
    from tpformer.config.store import register_configs, to_config

    register_configs()
    check_overrides(list(overrides), schema, config_name)
    with initialize_config_dir(config_dir=CONF_DIR, version_base=None):
        return to_config(compose(config_name, overrides=list(overrides)))
