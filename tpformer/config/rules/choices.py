"""Rules every config group shares: an Enum-typed key holds one of its values, a numeric key
with a `ranged` declaration a value in its range (Hydra checks the first when it composes;
configs built in code are checked here)."""

from __future__ import annotations

import dataclasses
import typing
from enum import Enum


def check_choices(config: object, prefix: str = "") -> None:
    """Every field holds a value its declaration allows: an Enum-typed field one of its values
    (Hydra already rejects others when it composes; this catches configs built in code), a
    numeric field with a `ranged` declaration a value in its range."""
    hints = typing.get_type_hints(type(config))
    for f in dataclasses.fields(config):  # type: ignore[arg-type]
        value, kind = getattr(config, f.name), hints[f.name]
        if dataclasses.is_dataclass(value):
            check_choices(value, f"{prefix}{f.name}.")
        elif isinstance(kind, type) and issubclass(kind, Enum):
            allowed = [m.value for m in kind]
            if value not in allowed:
                raise ValueError(f"{prefix}{f.name}={value!r} is not one of {allowed}")
        elif "range" in f.metadata and isinstance(value, (int, float)):
            bounds = f.metadata["range"]
            if not bounds.contains(value):
                raise ValueError(f"{prefix}{f.name}={value} must be {bounds}")
