"""A config record from the plain dict it was saved as (dataclasses.asdict in a checkpoint's
meta.json): nested groups rebuilt as their dataclasses, choices as their Enums. Without
OmegaConf, so that whatever reads a checkpoint imports without Hydra."""

from __future__ import annotations

import dataclasses
import enum
import typing
from typing import Any, TypeVar

from tpformer.config.reference import record_of

Record = TypeVar("Record")


def record_from_dict(cls: type[Record], data: dict[str, Any], where: str = "") -> Record:
    """`cls` with `data`'s values; a key `cls` lacks is a ValueError naming it and the keys it
    has (the dict was written by another version)."""
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(data) - names)
    if unknown:
        raise ValueError(f"{where}{unknown[0]} is not a key of {cls.__name__} ({sorted(names)})")
    values: dict[str, Any] = {}
    for name, value in data.items():
        hint, nested = hints[name], record_of(hints[name])
        if nested is not None and isinstance(value, dict):
            value = record_from_dict(nested, value, f"{where}{name}.")
        elif isinstance(hint, type) and issubclass(hint, enum.Enum):
            value = hint(value)
        values[name] = value
    return cls(**values)
