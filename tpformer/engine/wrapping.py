"""Wrapping a module without renaming it: the module's class becomes a subclass of its class
whose one method runs the module's own wrapper (as FSDP2's `fully_shard` swaps a module's
class). Parameter names, state dicts and hooks stay as they were, so checkpoints, the Hugging
Face key maps and the engine see the same module, and `isinstance` still holds. One subclass is
made per (class, method, kind of wrapper) and shared by every module wrapped alike, so
torch.compile's guards on the module's type hold across the blocks. What recomputation and
compilation use instead of assigning to `module.forward`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import nn

from tpformer.parallel.random import EAGER_ISLAND

Method = Callable[..., Any]
WRAPPED = "_tpformer_wrapped"
"""The instance attribute holding the module's wrappers, by "tag:method" (a method wrapped twice,
compiled then recomputed, has one wrapper per layer of subclass)."""

_CLASSES: dict[tuple[type, str, str, bool], type] = {}


def _wrapping_class(cls: type, name: str, tag: str, eager: bool) -> type:
    key = (cls, name, tag, eager)
    if key not in _CLASSES:
        slot = f"{tag}:{name}"

        def method(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
            return self.__dict__[WRAPPED][slot](*args, **kwargs)

        method.__name__ = name
        if eager:
            setattr(method, EAGER_ISLAND, True)
        _CLASSES[key] = type(f"{tag}{cls.__name__}", (cls,), {name: method})
    return _CLASSES[key]


def wrap_method(
    module: nn.Module, name: str, wrapper: Callable[[Method], Method], tag: str
) -> None:
    """Run `module.<name>` as `wrapper(the method as it was)` from now on. `tag` (`Recomputed`,
    `Compiled`, `Eager`) prefixes the new class's name, so a repr shows what wraps the module."""
    cls = type(module)
    wrapped = wrapper(getattr(cls, name).__get__(module, cls))
    eager = bool(getattr(wrapped, EAGER_ISLAND, False))
    slots = module.__dict__.setdefault(WRAPPED, {})
    if f"{tag}:{name}" in slots:
        raise ValueError(f"{type(module).__name__}.{name} is already wrapped as {tag}")
    slots[f"{tag}:{name}"] = wrapped
    module.__class__ = _wrapping_class(cls, name, tag, eager)
