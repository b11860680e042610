"""What a family's Hugging Face adapter holds (torchtitan's state_dict_adapter, with the
configs): the key map both ways, the configs both ways, the class names it reads and writes,
and the keys HF keeps as tied copies."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tpformer.config.families import Family
from tpformer.config.schema import ModelConfig
from tpformer.interop.hf_rules import Rule

KeyMap = Callable[[ModelConfig, str, str], dict[str, Rule]]
"""(config, our task, the HF body prefix present in the files) -> our name -> rule."""


def no_tied(config: ModelConfig, architecture: str) -> dict[str, str]:
    """A family whose classes keep no tied copies."""
    return {}


@dataclass(frozen=True)
class HFAdapter:
    """One family's Hugging Face side.

    `defaults`: the config.json model_type values it reads (its own, and one per flavor such
    as Mistral) -> the class a directory without `architectures` is read as; `classes`: HF
    class name -> our task (what a directory's `architectures` may name); `body_prefix`: the HF
    body prefix of its task classes (absent in the base class's files); `config_from_hf`
    refuses by name a shape tpformer does not build; `config_to_hf` and `export_class` refuse
    a config the HF class cannot hold; `tied`: HF keys written as copies of another key (the
    class `architecture`'s)."""

    family: Family
    defaults: dict[str, str]
    classes: dict[str, str]
    body_prefix: str
    key_map: KeyMap
    config_from_hf: Callable[[dict], ModelConfig]
    config_to_hf: Callable[..., Any]
    export_class: Callable[[ModelConfig, str], str]
    tied: Callable[[ModelConfig, str], dict[str, str]] = no_tied


def classic_keys(config: ModelConfig) -> dict[str, tuple[object, object]]:
    """(value, what the class holds) of the keys BERT's and GPT-2's Hugging Face classes fix
    alike: LayerNorm with biases, an ungated MLP, biased projections, one key/value head per
    query head."""
    return {
        "model.norm.kind": (config.norm.kind, "layernorm"),
        "model.norm.bias": (config.norm.bias, True),
        "model.mlp.gated": (config.mlp.gated, False),
        "model.bias": (config.bias, True),
        "model.num_kv_heads": (config.kv_heads, config.num_heads),
    }


def mismatches(wrong: dict[str, tuple[object, object]], family: str) -> list[str]:
    """'key=have (family: want)' for each key whose config value is not the one the family's
    Hugging Face class holds (what its config_to_hf refuses by name)."""
    return [
        f"{key}={have} ({family}: {want})" for key, (have, want) in wrong.items() if have != want
    ]


def export_class_of(exports: dict[str, str], family: str, task: str) -> str:
    """exports[task], or an error naming the tasks the family exports."""
    if task not in exports:
        raise ValueError(
            f"a {family} model with task {task!r} has no Hugging Face class; exported tasks: "
            f"{sorted(exports)}"
        )
    return exports[task]
