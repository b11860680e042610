"""The configuration reference, generated from the schema: every key of every group with its
type, allowed values, default and the attribute docstring written under the field in
config/schema/. tools/render_docs.py writes it into docs/configuration.md (a test checks that it
is fresh), so the reference cannot drift from the code."""

from __future__ import annotations

import ast
import dataclasses
import enum
import inspect
import types
import typing
from dataclasses import MISSING, Field

from tpformer.config.schema import (
    ClusterConfig,
    DataConfig,
    DryRunConfig,
    EvalLMConfig,
    FinetuneModelConfig,
    FinetuneTrainerConfig,
    GenerateConfig,
    GlueDataConfig,
    LauncherConfig,
    ModelConfig,
    OptimConfig,
    ParallelConfig,
    PlanOptions,
    Range,
    TrainerConfig,
)

PRETRAIN_GROUPS: dict[str, type] = {
    "model": ModelConfig,
    "parallel": ParallelConfig,
    "optim": OptimConfig,
    "data": DataConfig,
    "trainer": TrainerConfig,
    "launcher": LauncherConfig,
    "cluster": ClusterConfig,
}
"""tpformer-pretrain's groups (tpformer-plan adds `plan`)."""

FINETUNE_GROUPS: dict[str, type] = {
    "model": FinetuneModelConfig,
    "data": GlueDataConfig,
    "trainer": FinetuneTrainerConfig,
    "dry_run": DryRunConfig,
}
INFERENCE_COMMANDS: dict[str, type] = {
    "tpformer-generate": GenerateConfig,
    "tpformer-eval-lm": EvalLMConfig,
}
"""Where tpformer-finetune's groups differ from pretraining's (parallel, optim, launcher are
shared)."""


def field_docstrings(cls: type) -> dict[str, str]:
    """The string literal under each annotated field of cls and of its dataclass bases."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        body = ast.parse(inspect.getsource(klass)).body[0]
        assert isinstance(body, ast.ClassDef)
        for node, after in zip(body.body, body.body[1:]):
            if (
                isinstance(node, ast.AnnAssign)
                and isinstance(node.target, ast.Name)
                and isinstance(after, ast.Expr)
                and isinstance(after.value, ast.Constant)
                and isinstance(after.value.value, str)
            ):
                docs[node.target.id] = inspect.cleandoc(after.value.value)
    return docs


def default_of(f: Field[typing.Any]) -> object:
    if f.default is not MISSING:
        return f.default
    if f.default_factory is not MISSING:
        return f.default_factory()
    return MISSING


def format_value(value: object) -> str:
    """A default as a user writes it; a key without one (dataclasses' or OmegaConf's MISSING,
    "???") is "required"."""
    if value is MISSING or value == "???":
        return "required"
    if isinstance(value, enum.Enum):
        return str(value.value)
    if value is None:
        return "null"
    if isinstance(value, str):
        return value if value else '""'
    return str(value).lower() if isinstance(value, bool) else str(value)


def allowed_values(cls: type, f: Field[typing.Any]) -> str:
    """The values a key accepts: an Enum's members, a numeric range, or its type."""
    hint = typing.get_type_hints(cls)[f.name]
    rng = f.metadata.get("range")
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return ", ".join(f"`{m.value}`" for m in hint)
    union = typing.get_origin(hint) in (typing.Union, types.UnionType)
    members = list(typing.get_args(hint)) if union else [hint]
    optional = type(None) in members
    kinds = [getattr(m, "__name__", str(m).replace("typing.", "")) for m in members]
    kinds = [k for k in kinds if k != "NoneType"]
    first = f"{kinds[0]} {rng}" if isinstance(rng, Range) else kinds[0]
    return " or ".join([first, *kinds[1:], *(["null"] if optional else [])])


def group_table(group: str, cls: type) -> str:
    """One row per key of `cls` (a command's top level: its own keys, not its groups)."""
    rows = ["| key | default | values | meaning |", "|---|---|---|---|"]
    return "\n".join(rows + _rows(group, cls))


def _rows(group: str, cls: type) -> list[str]:
    """The table rows of cls's keys under `group`; a section of a group (trainer.profile)
    adds its keys in line, a command's groups (at the top level) have their own tables."""
    docs, hints = field_docstrings(cls), typing.get_type_hints(cls)
    rows = []
    for f in dataclasses.fields(cls):
        key = f"{group}.{f.name}" if group else f.name
        section = f.default_factory is not dataclasses.MISSING and dataclasses.is_dataclass(
            f.default_factory
        )
        if section:
            rows += _rows(key, f.default_factory) if group else []  # type: ignore[arg-type]
            continue
        meaning = " ".join(docs.get(f.name, "").split()).replace("|", "\\|")
        variant = optional_record(hints[f.name])
        values = "a group or null" if variant else allowed_values(cls, f)
        rows.append(f"| `{key}` | {format_value(default_of(f))} | {values} | {meaning} |")
        if variant is not None and group:  # a variant group (model.rotary): its keys in line
            rows += _rows(key, variant)
    return rows


def optional_record(hint: typing.Any) -> type | None:
    """The dataclass of an optional group (`RotaryConfig | None`: absent when off), else None."""
    return record_of(hint) if type(None) in typing.get_args(hint) else None


def config_reference_markdown() -> str:
    """Markdown: one section per group of tpformer-pretrain, then what tpformer-finetune and
    tpformer-plan use differently."""
    parts = []
    for group, cls in PRETRAIN_GROUPS.items():
        doc = inspect.cleandoc(cls.__doc__ or "")
        parts += [f"### `{group}`", "", " ".join(doc.split()), "", group_table(group, cls), ""]
    parts += ["### `plan` (tpformer-plan)", "", group_table("plan", PlanOptions), ""]
    parts += [
        "## tpformer-finetune",
        "",
        "`task` and `init` are required; `parallel`, `optim` and `launcher` are the groups "
        "above (`optim` defaults to the `finetune` preset).",
        "",
    ]
    for group, cls in FINETUNE_GROUPS.items():
        doc = inspect.cleandoc(cls.__doc__ or "")
        parts += [
            f"### `{group}` (fine-tuning)",
            "",
            " ".join(doc.split()),
            "",
            group_table(group, cls),
            "",
        ]
    for command, cls in INFERENCE_COMMANDS.items():
        doc = inspect.cleandoc(cls.__doc__ or "")
        parts += [
            f"## {command}",
            "",
            " ".join(doc.split()) + " `parallel` and `launcher` are the groups above.",
            "",
            group_table("", cls),
            "",
        ]
    return "\n".join(parts)


def record_of(hint: typing.Any) -> type | None:
    """The dataclass a field holds (through Optional), else None."""
    candidates = [hint, *typing.get_args(hint)]
    return next(
        (c for c in candidates if isinstance(c, type) and dataclasses.is_dataclass(c)), None
    )


def key_docstring(key: str, schema: type) -> str:
    """The schema's docstring of a dotted key ("" if it has none)."""
    cls: type | None = schema
    parts = key.split(".")
    for part in parts[:-1]:
        cls = record_of(typing.get_type_hints(cls)[part]) if cls is not None else None
    return " ".join(field_docstrings(cls).get(parts[-1], "").split()) if cls is not None else ""
