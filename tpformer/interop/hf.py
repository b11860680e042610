"""Hugging Face interop: load `save_pretrained` directories at any TP degree, export back.

Loading reads only this rank's slices (safetensors slices, or an mmap'ed pytorch_model.bin),
so no rank materializes the full checkpoint. Export gathers full tensors, maps them to HF keys
and lets `transformers` write the directory with `save_pretrained`, so `from_pretrained` loads it.
Each family's key map, configs and class names are its adapter (interop/families/).
"""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from tpformer.config.schema import ModelConfig
from tpformer.interop.families import (
    SUPPORTED,
    adapter_for,
    adapter_of,
    hf_config_from_model,
    model_config_from_hf,
)
from tpformer.interop.hf_files import CheckpointFiles, read_hf_config
from tpformer.interop.hf_rules import FusedQKV, GatedRows, Plain, Rule
from tpformer.models.base import TPModel
from tpformer.parallel.context import ParallelContext
from tpformer.parallel.init import full_state_dict, logical_shape
from tpformer.parallel.param_info import param_info

log = logging.getLogger(__name__)

IGNORED_KEYS = ("position_ids", "attn.bias", "attn.masked_bias")
HEAD_KEYS = ("cls.", "classifier.", "lm_head.", "qa_outputs.", "head.", "decoder.")
"""Heads of other HF tasks: a BertForPreTraining checkpoint loads into BertModel, say."""


# ----------------------------------------------------------------------------- reading


# ----------------------------------------------------------------------------- loading


def _stored_shape(files: CheckpointFiles, rule: Rule) -> list[int]:
    """The shape `rule` assembles, in our [out, in] orientation, from the stored tensors."""
    if isinstance(rule, Plain):
        shape = files.shape(rule.key)
        return shape[::-1] if rule.transposed else shape
    shapes = [files.shape(k) for k in rule.keys]
    if isinstance(rule, FusedQKV) and rule.transposed:
        shapes = [s[::-1] for s in shapes]
    return [sum(s[0] for s in shapes), *shapes[0][1:]]


def _read_rows(files: CheckpointFiles, key: str, transposed: bool, start: int, stop: int) -> Tensor:
    """Rows [start, stop) of the stored tensor in our orientation (its columns if transposed)."""
    if transposed:
        return files.read(key, 1, start, stop).t().contiguous()
    return files.read(key, 0, start, stop)


def _local_tensor(
    files: CheckpointFiles, rule: Rule, param: Tensor, model_cfg: ModelConfig, rank: int
) -> Tensor:
    """This rank's slice of the tensor `rule` describes, read without the rest."""
    info = param_info(param)
    dim = info.tp_dim
    if isinstance(rule, FusedQKV):  # this rank's key/value groups: [q x group, k, v] each
        hidden, heads = model_cfg.hidden_size, model_cfg.num_heads
        head_dim, group = hidden // heads, heads // model_cfg.kv_heads
        spans = (group * head_dim, head_dim, head_dim)  # rows per group of q, k, v
        groups = param.shape[0] // sum(spans)
        starts = (0, hidden, hidden + model_cfg.kv_heads * head_dim)  # in GPT-2's [q|k|v]
        parts = []
        for j, span in enumerate(spans):
            key, offset = (rule.keys[j], 0) if len(rule.keys) == 3 else (rule.keys[0], starts[j])
            transposed = rule.transposed and param.dim() == 2
            first = offset + rank * groups * span
            part = _read_rows(files, key, transposed, first, first + groups * span)
            parts.append(part.reshape(groups, span, *part.shape[1:]))
        return torch.cat(parts, dim=1).reshape(param.shape)
    if isinstance(rule, GatedRows):  # this rank's units: [gate, up] each (a whole parameter's)
        half = param.shape[0] // 2
        first = 0 if dim is None else rank * half
        if len(rule.keys) == 2:
            gate, up = (files.read(k, 0, first, first + half) for k in rule.keys)
        else:  # one [gate | up] tensor
            whole = files.shape(rule.keys[0])[0] // 2
            gate, up = (files.read(rule.keys[0], 0, o + first, o + first + half)
                        for o in (0, whole))  # fmt: skip
        rest = gate.shape[1:]
        blocks = [t.reshape(-1, rule.block, *rest) for t in (gate, up)]
        return torch.stack(blocks, dim=1).reshape(param.shape)
    transposed = rule.transposed and param.dim() == 2
    if dim is None or info.logical_size is None:
        full = files.read(rule.key)
        return full.t() if transposed else full
    chunk, logical = param.shape[dim], info.logical_size
    start, stop = rank * chunk, min((rank + 1) * chunk, logical)
    if dim == 0:
        local = _read_rows(files, rule.key, transposed, start, max(start, stop))
    else:  # a row-parallel weight: our columns are the stored rows when transposed
        local = (
            files.read(rule.key, 0, start, stop).t()
            if transposed
            else files.read(rule.key, 1, start, stop)
        )
    if local.shape[dim] < chunk:  # vocabulary padding rows
        pad = list(local.shape)
        pad[dim] = chunk - local.shape[dim]
        local = torch.cat([local, local.new_zeros(pad)], dim=dim)
    return local


def _hf_prefix(keys: list[str], body: str) -> str:
    """The HF body prefix `body` when the files carry it (a task class's), else none."""
    return body if any(k.startswith(body) for k in keys) else ""


@torch.no_grad()
def load_hf_weights(model: nn.Module, directory: str | Path, ctx: ParallelContext) -> list[str]:
    """Copy a HF checkpoint into `model`, each rank reading only its own slices.

    Returns the head parameters the checkpoint lacks (they keep their initialization), e.g.
    the NSP head when loading BertForMaskedLM. Raises ValueError naming missing body keys,
    unexpected keys and shape mismatches.
    """
    directory = Path(directory)
    files = CheckpointFiles(directory)
    config: ModelConfig = model.config  # type: ignore[assignment]
    task = task_of(model)
    keys = files.keys()
    adapter = adapter_of(config)
    rules = adapter.key_map(config, task, _hf_prefix(keys, adapter.body_prefix))
    available = set(keys)
    body = "" if task == "base" else ("bert." if config.arch == "bert" else "transformer.")
    missing = {
        name: [k for k in _rule_keys(rule) if k not in available] for name, rule in rules.items()
    }
    optional = {n for n in rules if not n.startswith(body) or ".pooler." in f".{n}"}  # heads
    skipped = [n for n, ks in missing.items() if ks and n in optional]
    missing_body = sorted(k for n, ks in missing.items() if n not in optional for k in ks)
    needed = {k for rule in rules.values() for k in _rule_keys(rule)}
    unexpected = sorted(
        k
        for k in available - needed
        if not k.endswith(IGNORED_KEYS) and not k.startswith(HEAD_KEYS)
    )
    if missing_body or unexpected:
        raise ValueError(
            f"checkpoint {directory} does not match the model: missing keys "
            f"{missing_body}, unexpected keys {unexpected}"
        )
    params = dict(model.named_parameters())
    mismatched = []
    for name, rule in rules.items():
        if name in skipped:
            continue
        expected = list(logical_shape(params[name]))
        stored = _stored_shape(files, rule)
        if stored != expected:
            mismatched.append(
                f"{name} <- {_rule_keys(rule)[0]}: checkpoint {stored} vs model {expected}"
            )
    if mismatched:
        raise ValueError(
            f"checkpoint {directory} has other shapes than the model: " + "; ".join(mismatched)
        )
    for name, rule in rules.items():
        if name not in skipped:
            params[name].copy_(_local_tensor(files, rule, params[name], config, ctx.tp.rank))
    if skipped:
        log.warning("not in %s, left at their initialization: %s", directory, skipped)
    return skipped


def task_of(model: nn.Module) -> str:
    """The build_model task of a built model ("pretraining", "classification", ...)."""
    from tpformer.models import TASKS

    return next(task for (_, task), cls in TASKS.items() if type(model) is cls)


def _rule_keys(rule: Rule) -> tuple[str, ...]:
    return (rule.key,) if isinstance(rule, Plain) else rule.keys


def load_hf_model(
    directory: str | Path,
    ctx: ParallelContext,
    *,
    task: str | None = None,
    overrides: dict[str, Any] | None = None,
    **kwargs: Any,
) -> TPModel:
    """Build the tpformer model of a HF directory at ctx's layout and load its weights.

    `task` defaults to the checkpoint's own (BertForMaskedLM -> pretraining, ...); classifiers
    take num_labels from the checkpoint unless given; `overrides` replace model config keys that
    shape no parameter (dropout).
    """
    from tpformer.models import build_model

    hf = read_hf_config(directory)
    adapter = adapter_for(hf)
    architecture = (hf.get("architectures") or [adapter.defaults[hf["model_type"]]])[0]
    if architecture not in SUPPORTED:
        raise ValueError(
            f"architecture {architecture!r} in {directory}/config.json is not "
            f"supported; supported: {sorted(SUPPORTED)}"
        )
    config = replace(model_config_from_hf(hf), **(overrides or {}))
    task = task or SUPPORTED[architecture]
    if task == "classification" and "num_labels" not in kwargs:
        kwargs["num_labels"] = len(hf.get("id2label") or {0: 0, 1: 1})
    model = build_model(config, ctx, task=task, **kwargs)
    load_hf_weights(model, directory, ctx)
    return model


# ----------------------------------------------------------------------------- export


def to_hf_state_dict(
    model: nn.Module, ctx: ParallelContext, architecture: str
) -> dict[str, Tensor]:
    """Full HF-named tensors of `model` (all-gathers over TP; same on every TP rank)."""
    config: ModelConfig = model.config  # type: ignore[assignment]
    task = task_of(model)
    adapter = adapter_of(config)
    prefix = "" if task == "base" else adapter.body_prefix
    full = full_state_dict(model, ctx.tp)
    head_dim = config.hidden_size // config.num_heads
    group = config.num_heads // config.kv_heads
    out: dict[str, Tensor] = {}
    for name, rule in adapter.key_map(config, task, prefix).items():
        t = full[name]
        if isinstance(rule, Plain):
            out[rule.key] = t.t().contiguous() if rule.transposed and t.dim() == 2 else t
            continue
        if isinstance(rule, GatedRows):
            gated = t.reshape(-1, 2, rule.block, *t.shape[1:])
            gate, up = (gated[:, i].reshape(-1, *t.shape[1:]) for i in (0, 1))
            if len(rule.keys) == 2:
                out.update(zip(rule.keys, (gate, up)))
            else:
                out[rule.keys[0]] = torch.cat([gate, up])
            continue
        qkv = t.reshape(config.kv_heads, group + 2, head_dim, *t.shape[1:])
        parts = [
            qkv[:, :group].reshape(-1, *t.shape[1:]),
            qkv[:, group].reshape(-1, *t.shape[1:]),
            qkv[:, group + 1].reshape(-1, *t.shape[1:]),
        ]
        if len(rule.keys) == 3:
            out.update(zip(rule.keys, parts))
        else:
            fused = torch.cat(parts, dim=0)
            out[rule.keys[0]] = (
                fused.t().contiguous() if rule.transposed and t.dim() == 2 else fused
            )
    for copy, source in adapter.tied(config, architecture).items():
        out[copy] = out[source]
    return out


def save_hf_checkpoint(
    model: nn.Module,
    ctx: ParallelContext,
    directory: str | Path,
    *,
    id2label: dict[int, str] | None = None,
    special_ids: dict[str, int | None] | None = None,
    problem_type: str | None = None,
) -> None:
    """Write `model` as a HF directory that transformers' from_pretrained loads; a classifier
    records num_labels, `id2label` (and label2id) and its problem type (regression for 1
    label, or `problem_type`: multi_label_classification);
    `special_ids` (pad/bos/eos_token_id, from the exported tokenizer) replace the config's
    defaults (GPT-2's 50256 lies outside a smaller vocabulary).

    Every TP rank takes part in the gathers; global rank 0 writes through `save_pretrained`.
    """
    import transformers

    config: ModelConfig = model.config  # type: ignore[assignment]
    architecture = adapter_of(config).export_class(config, task_of(model))
    state = to_hf_state_dict(model, ctx, architecture)
    if not ctx.is_main:
        return
    extra: dict[str, Any] = dict(special_ids or {})
    if architecture.endswith("ForSequenceClassification"):
        extra["num_labels"] = model.num_labels
        if model.num_labels == 1:
            extra["problem_type"] = "regression"
        elif problem_type is not None:
            extra["problem_type"] = problem_type
        if id2label is not None:
            extra["id2label"] = id2label
            extra["label2id"] = {v: k for k, v in id2label.items()}
    hf_config = hf_config_from_model(config, architecture, **extra)
    hf_model = getattr(transformers, architecture)(hf_config)
    result = hf_model.load_state_dict(state, strict=False)
    if result.missing_keys or result.unexpected_keys:
        raise RuntimeError(
            f"export mapping incomplete: missing {result.missing_keys}, "
            f"unexpected {result.unexpected_keys}"
        )
    hf_model.save_pretrained(directory)
