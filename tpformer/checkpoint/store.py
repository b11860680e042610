"""Checkpoint directories: written under a temporary name and renamed when complete, a
`latest` marker updated last, the newest `keep_last` kept.

    <run_dir>/checkpoints/step00000300/   .metadata + one shard file per rank (DCP), meta.json
    <run_dir>/checkpoints/latest          "step00000300"

A directory is complete only once it has meta.json, written by rank 0 after every rank's DCP
write returned and before the rename, so a save cut off mid-way is never picked up.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from tpformer.config.schema import ModelConfig, ParallelConfig
from tpformer.parallel.context import ParallelContext
from tpformer.parallel.layout import Layout

log = logging.getLogger(__name__)
FORMAT_VERSION = 2
"""2: the loss scaler and non-finite count moved into the engine's state (engine.loss_scale)."""
META = "meta.json"


MODEL_KEYS = ("arch", "num_layers", "hidden_size", "num_heads", "intermediate_size", "vocab_size")
"""Model fields a checkpoint must agree on to load (everything else may change)."""


def checkpoint_meta(model: ModelConfig, parallel: ParallelConfig, layout: Layout, *, task: str,
                    run_config: dict[str, object], **extra: object) -> dict[str, object]:
    """What meta.json records besides the step: the model's shape and task (what export
    builds), the layout it was saved at, and the run's resolved config ({"model": ..., ...})."""
    return {**{k: getattr(model, k) for k in MODEL_KEYS}, "task": task,
            "world_size": layout.world_size, "tensor": layout.tp, "data": layout.dp,
            "zero_stage": parallel.zero_stage, "precision": parallel.precision,
            "config": {"model": asdict(model), **run_config}, **extra}


def model_mismatches(meta: dict[str, object], model: ModelConfig) -> dict[str, tuple[object, object]]:
    """{field: (checkpoint value, run value)} for the model fields that differ."""
    return {k: (meta.get(k), getattr(model, k)) for k in MODEL_KEYS
            if meta.get(k) != getattr(model, k)}


def step_dir_name(step: int) -> str:
    return f"step{step:08d}"


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


TOKENIZER_DIR = "tokenizer"
"""Subdirectory of a checkpoint holding a copy of the run's tokenizer files."""


def save(root: Path, step: int, state: dict[str, object], ctx: ParallelContext, *,
         meta: dict[str, object], keep_last: int, tokenizer_files: Sequence[Path] = ()) -> Path:
    """Every rank writes its own part of `state` (keys must be unique per rank); rank 0 copies
    the tokenizer files into <checkpoint>/tokenizer/ before the directory becomes complete."""
    final = root / step_dir_name(step)
    tmp = root / f".tmp-{step_dir_name(step)}"
    if ctx.is_main:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    _barrier()
    try:
        dcp.save(state, checkpoint_id=str(tmp), no_dist=not dist.is_initialized())
    except OSError as err:
        raise OSError(f"saving the checkpoint of step {step} to {tmp} failed ({err}); the "
                      f"previous checkpoints in {root} are intact") from err
    _barrier()
    if ctx.is_main:
        copy_tokenizer(tokenizer_files, tmp / TOKENIZER_DIR)
        (tmp / META).write_text(json.dumps({"format_version": FORMAT_VERSION, "step": step, **meta}))
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
        marker = root / ".latest.tmp"
        marker.write_text(final.name)
        os.replace(marker, root / "latest")
        complete = sorted(p for p in root.glob("step*") if (p / META).exists())
        for old in complete[:-keep_last] if keep_last > 0 else []:
            shutil.rmtree(old, ignore_errors=True)
        log.info("saved checkpoint %s", final)
    _barrier()
    return final


def copy_tokenizer(files: Sequence[Path], target: Path) -> None:
    if files:
        target.mkdir(parents=True, exist_ok=True)
        for file in files:
            shutil.copy2(file, target / file.name)


def find_latest(root: Path) -> Path | None:
    """The newest complete checkpoint under root (the marker if it is valid, else a scan)."""
    marker = root / "latest"
    if marker.exists():
        candidate = root / marker.read_text().strip()
        if (candidate / META).exists():
            return candidate
    complete = sorted(p for p in root.glob("step*") if (p / META).exists())
    return complete[-1] if complete else None


def read_meta(directory: Path) -> dict[str, object]:
    path = directory / META
    if not directory.is_dir() or not path.exists():
        raise FileNotFoundError(f"{directory} is not a complete tpformer checkpoint (no {META}); "
                                "pass a checkpoints/stepNNNNNNNN directory or trainer.resume=auto")
    meta = json.loads(path.read_text())
    if meta.get("format_version", 0) > FORMAT_VERSION:
        raise ValueError(f"{directory} has checkpoint format {meta['format_version']}, newer than "
                         f"this tpformer's {FORMAT_VERSION}; upgrade tpformer to load it")
    return meta


def load(directory: Path, template: dict[str, object]) -> dict[str, object]:
    """Fill `template` (this rank's keys, shaped as saved) in place from `directory`."""
    dcp.load(template, checkpoint_id=str(directory), no_dist=not dist.is_initialized())
    return template


def rng_state() -> dict[str, torch.Tensor]:
    state = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state
