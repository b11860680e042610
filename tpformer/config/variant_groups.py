"""The model's variant groups (rotary positions, local attention): records that are absent
(null) when the model does not use them. Hydra cannot set a key inside an absent record, so a
group is turned on by choosing it, `+model/rotary=on` (its defaults, then `model.rotary.KEY=`
over them), and off with `model.rotary=null`. The overrides are checked against the preset
before Hydra composes, so a key set inside an absent group is one line saying how to turn it
on, not Hydra's merge error."""

from __future__ import annotations

import dataclasses
import typing

from tpformer.config.groups import default_option
from tpformer.config.presets import PRESETS
from tpformer.config.reference import optional_record
from tpformer.config.schema import ModelConfig

ON = "on"
"""The option of `model/<group>` that turns a group on with its defaults."""


def variant_groups() -> dict[str, type]:
    """ModelConfig's optional records: field name -> its dataclass."""
    hints = typing.get_type_hints(ModelConfig)
    records = {f.name: optional_record(hints[f.name]) for f in dataclasses.fields(ModelConfig)}
    return {name: record for name, record in records.items() if record is not None}


def check_variant_overrides(overrides: list[str], config_name: str = "config") -> None:
    """Raise ValueError for the first override that Hydra would fail on (or silently apply
    wrongly) in a variant group: a key inside a group the preset leaves absent and the command
    does not turn on, a whole record given as a value, the group chosen without `+`, or chosen
    over a preset that has it (its values would return to the defaults)."""
    preset_name = next(
        (o.partition("=")[2] for o in overrides if o.partition("=")[0] == "model"), None
    )
    name = preset_name or default_option(config_name, "model") or ""
    preset = PRESETS.get(name)
    if preset is None:
        return  # Hydra names the valid presets
    chosen = {o.partition("=")[0].lstrip("+") for o in overrides if o.startswith("+model/")}
    for override in overrides:
        key, _, value = override.partition("=")
        for group in variant_groups():
            held = getattr(preset, group) is not None
            turn_on = f"+model/{group}={ON}"
            if key == f"model/{group}":
                raise ValueError(f"{override}: a variant group is added: write {turn_on}")
            if key == f"+model/{group}" and held:
                raise ValueError(
                    f"{override}: model={name} has model.{group} already (the option would "
                    f"reset it to the defaults); set its keys: model.{group}.KEY=VALUE"
                )
            absent = not held and f"model/{group}" not in chosen
            if key.lstrip("+~").startswith(f"model.{group}.") and absent:
                raise ValueError(
                    f"{override}: model={name} has no model.{group} (null); turn it on first: "
                    f"{turn_on} {override.lstrip('+')}"
                )
            if key.lstrip("+") == f"model.{group}" and value.startswith("{"):
                raise ValueError(
                    f"{override}: give the group's keys one by one"
                    f"{'' if held else f' after {turn_on}'}: model.{group}.KEY=VALUE"
                )
