"""Checkpoint directories: written under a temporary name and renamed when complete, a
`latest` marker updated last, the newest `keep_last` kept.

    <run_dir>/checkpoints/step00000300/   .metadata + one shard file per rank (DCP), meta.json
    <run_dir>/checkpoints/latest          "step00000300"

A directory is complete only once it has meta.json, written by rank 0 after every rank's DCP
write returned and before the rename, so a save cut off mid-way is never picked up.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from tpformer.config.schema import ModelConfig, ParallelConfig
from tpformer.parallel.comm import ProcessGroup, broadcast_object
from tpformer.parallel.comm.objects import barrier, distributed, objects_of, world_rank
from tpformer.parallel.context import ParallelContext
from tpformer.parallel.layout import Layout

log = logging.getLogger(__name__)
FORMAT_VERSION = 2
"""2: the loss scaler and non-finite count moved into the engine's state (engine.loss_scale)."""
META = "meta.json"
CHECKPOINTS = "checkpoints"
"""Where a run directory keeps its checkpoints (trainer.resume=auto looks there)."""
LATEST = "latest"
"""The marker file naming the newest complete checkpoint directory."""


MODEL_KEYS = ("arch", "num_layers", "hidden_size", "num_heads", "intermediate_size", "vocab_size")
"""Model fields a checkpoint must agree on to load (everything else may change)."""


def checkpoint_meta(
    model: ModelConfig,
    parallel: ParallelConfig,
    layout: Layout,
    *,
    task: str,
    run_config: dict[str, Any],
    **extra: Any,
) -> dict[str, Any]:
    """What meta.json records besides the step: the model's shape and task (what export
    builds), the layout it was saved at, and the run's resolved config ({"model": ..., ...})."""
    return {
        **{k: getattr(model, k) for k in MODEL_KEYS},
        "task": task,
        "world_size": layout.world_size,
        "tensor": layout.tp,
        "data": layout.dp,
        "pipeline": layout.pp,
        "zero_stage": parallel.zero_stage,
        "precision": parallel.precision,
        "config": {"model": asdict(model), **run_config},
        **extra,
    }


def model_mismatches(meta: dict[str, Any], model: ModelConfig) -> dict[str, tuple[object, object]]:
    """{field: (checkpoint value, run value)} for the model fields that differ."""
    return {
        k: (meta.get(k), getattr(model, k)) for k in MODEL_KEYS if meta.get(k) != getattr(model, k)
    }


def step_dir_name(step: int) -> str:
    return f"step{step:08d}"


TOKENIZER_DIR = "tokenizer"
"""Subdirectory of a checkpoint holding a copy of the run's tokenizer files."""


class CheckpointError(ValueError):
    """A checkpoint that is incomplete, damaged, of a newer format or of another model."""


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 22):
            digest.update(chunk)
    return digest.hexdigest()


def _checksums(directory: Path, names: Sequence[str]) -> dict[str, list]:
    """{file name: [size, sha256]} of the named files of a checkpoint directory."""
    return {n: [(directory / n).stat().st_size, _sha256(directory / n)] for n in names}


def _one_line(err: BaseException) -> str:
    text = str(err).strip()
    return f"{type(err).__name__}: {text.splitlines()[-1] if text else ''}"


def save(
    root: Path,
    step: int,
    state: dict[str, Any],
    ctx: ParallelContext,
    *,
    meta: dict[str, Any],
    keep_last: int,
    tokenizer_files: Sequence[Path] = (),
    group: ProcessGroup | None = None,
) -> Path:
    """Every rank writes its own part of `state` (keys must be unique per rank) and hashes the
    shard files it wrote; rank 0 adds the tokenizer files and meta.json (with every file's
    checksum) before the directory becomes complete. A failed write on any rank raises OSError
    on every rank, naming the cause, with the temporary directory removed. `group` (every rank;
    default: the default group) carries the save's own collectives: a background writer passes
    a gloo group of its own, so they never interleave with training's."""
    final = root / step_dir_name(step)
    tmp = root / f".tmp-{step_dir_name(step)}"
    if ctx.is_main:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    import torch.distributed.checkpoint as dcp  # on first use: 0.6 s the launcher never needs
    from torch.distributed.checkpoint.api import CheckpointException

    barrier(group, monitor=ctx.monitor)
    rank = world_rank()
    try:  # DCP reports a failed write as CheckpointException, a BaseException
        with _quiet_single_process():
            dcp.save(
                state,
                checkpoint_id=str(tmp),
                process_group=group,
                no_dist=not distributed(),
            )
        outcome: dict[str, list] | str = _checksums(
            tmp, sorted(p.name for p in tmp.glob(f"__{rank}_*"))
        )
    except (OSError, CheckpointException) as err:
        outcome = _one_line(err)
    outcomes = objects_of(outcome, group, monitor=ctx.monitor)
    failures = [f"rank {r}: {o}" for r, o in enumerate(outcomes) if isinstance(o, str)]
    if failures:
        if ctx.is_main:
            shutil.rmtree(tmp, ignore_errors=True)
        raise OSError(
            f"saving the checkpoint of step {step} to {tmp} failed "
            f"({'; '.join(failures)}); the previous checkpoints in {root} are intact"
        )
    if ctx.is_main:
        _complete(tmp, final, step, outcomes, meta, tokenizer_files, keep_last)
    barrier(group, monitor=ctx.monitor)
    return final


def _complete(
    tmp: Path,
    final: Path,
    step: int,
    outcomes: list[object],
    meta: dict[str, Any],
    tokenizer_files: Sequence[Path],
    keep_last: int,
) -> None:
    """Rank 0, every shard written: the tokenizer and meta.json (every file's checksum) added,
    the directory renamed into place, the latest marker moved, old checkpoints removed."""
    root = final.parent
    copy_tokenizer(tokenizer_files, tmp / TOKENIZER_DIR)
    sums: dict[str, list] = {}
    for part in outcomes:
        assert isinstance(part, dict)  # a failure (a str) was raised above
        sums.update(part)
    sums.update(
        _checksums(tmp, [".metadata", *(f"{TOKENIZER_DIR}/{f.name}" for f in tokenizer_files)])
    )
    (tmp / META).write_text(
        json.dumps({"format_version": FORMAT_VERSION, "step": step, **meta, "checksums": sums})
    )
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    marker = root / ".latest.tmp"
    marker.write_text(final.name)
    os.replace(marker, root / LATEST)
    complete = sorted(p for p in root.glob("step*") if (p / META).exists())
    for old in complete[:-keep_last] if keep_last > 0 else []:
        shutil.rmtree(old, ignore_errors=True)
    log.info("saved checkpoint %s", final)


def copy_tokenizer(files: Sequence[Path], target: Path) -> None:
    if files:
        target.mkdir(parents=True, exist_ok=True)
        for file in files:
            shutil.copy2(file, target / file.name)


def _candidates(root: Path) -> list[Path]:
    """Checkpoints under root with a meta.json: the `latest` marker's first, then newest first."""
    complete = sorted((p for p in root.glob("step*") if (p / META).exists()), reverse=True)
    marker = root / LATEST
    named = root / marker.read_text().strip() if marker.is_file() else None
    return ([named] if named in complete else []) + [p for p in complete if p != named]


def find_latest(root: Path) -> Path | None:
    """The newest complete checkpoint under root (the marker if it is valid, else a scan)."""
    candidates = _candidates(root)
    return candidates[0] if candidates else None


def verify(directory: Path, *, digests: bool = True) -> dict[str, Any]:
    """meta.json of a complete checkpoint whose files all match their recorded checksums;
    raises CheckpointError naming the first file that does not. digests=False checks the
    files' presence and sizes only (a stat each: what a launcher checks before starting ranks,
    which hash them again)."""
    meta = read_meta(directory)
    for name, (size, digest) in dict(meta.get("checksums", {})).items():
        path = directory / name
        if not path.is_file():
            raise CheckpointError(f"{path} is missing: the checkpoint {directory} is damaged")
        if path.stat().st_size != size:
            raise CheckpointError(
                f"{path} has {path.stat().st_size} bytes but {size} were "
                f"written: the checkpoint {directory} is damaged (truncated?)"
            )
        if digests and _sha256(path) != digest:
            raise CheckpointError(
                f"{path} does not match the checksum recorded when it was "
                f"written: the checkpoint {directory} is damaged"
            )
    return meta


def choose_checkpoint(
    root: Path, explicit: Path | None, ctx: ParallelContext, *, check: bool
) -> Path | None:
    """The checkpoint to resume from, decided by rank 0 and the same on every rank: `explicit`
    (which must be intact), or else the newest intact one under root, skipping damaged ones
    with a warning naming the file. check=False trusts the files (meta.json must still parse)."""
    outcome: object = None
    if ctx.is_main:
        try:
            outcome = _choose(root, explicit, check=check)
        except CheckpointError as err:
            outcome = str(err)
    outcome = broadcast_object(outcome, monitor=ctx.monitor)
    if isinstance(outcome, str):
        raise CheckpointError(outcome)
    return outcome  # type: ignore[return-value]


def newest_checkpoint(root: Path) -> Path | None:
    """The newest checkpoint under root whose meta.json reads (what trainer.resume=auto will
    pick unless its files turn out damaged), or None."""
    return _choose(root, None, check=False)


def _choose(root: Path, explicit: Path | None, *, check: bool) -> Path | None:
    inspect = verify if check else read_meta
    if explicit is not None:
        inspect(explicit)
        return explicit
    for candidate in _candidates(root):
        try:
            inspect(candidate)
            return candidate
        except CheckpointError as err:
            log.warning("trainer.resume=auto: skipping %s: %s", candidate.name, err)
    return None


def read_meta(directory: Path) -> dict[str, Any]:
    path = directory / META
    if not directory.is_dir() or not path.exists():
        raise CheckpointError(
            f"{directory} is not a complete tpformer checkpoint (no {META}); "
            "pass a checkpoints/stepNNNNNNNN directory or trainer.resume=auto"
        )
    try:
        meta = json.loads(path.read_text())
        if not isinstance(meta, dict) or "step" not in meta:
            raise ValueError("no step recorded")
    except ValueError as err:
        raise CheckpointError(
            f"{path} is unreadable ({err}): the checkpoint {directory} is damaged"
        ) from None
    if meta.get("format_version", 0) > FORMAT_VERSION:
        raise CheckpointError(
            f"{directory} has checkpoint format {meta['format_version']}, newer "
            f"than this tpformer's {FORMAT_VERSION}; upgrade tpformer to load it"
        )
    return meta


def load(directory: Path, template: dict[str, Any]) -> dict[str, Any]:
    """Fill `template` (this rank's keys, shaped as saved) in place from `directory`.

    NOTE: DCP's .metadata is a pickle: load only checkpoints you trust."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    try:
        with _quiet_single_process():
            dcp.load(template, checkpoint_id=str(directory), no_dist=not distributed())
    except (CheckpointException, Exception) as err:  # DCP's errors, named once
        raise CheckpointError(
            f"reading the checkpoint {directory} failed ({_one_line(err)}); "
            f"its files may be damaged (trainer.verify_checkpoint=true names "
            f"the file)"
        ) from None
    return template


def saved_keys(directory: Path) -> set[str]:
    """The top-level keys of a checkpoint's state (e.g. "engine", "rng_rank0"): an imported
    checkpoint (tpformer-convert from-hf) holds no RNG states."""
    import torch.distributed.checkpoint as dcp

    try:
        metadata = dcp.FileSystemReader(str(directory)).read_metadata()
    except Exception as err:  # DCP's errors, named once
        raise CheckpointError(
            f"reading the checkpoint {directory} failed ({_one_line(err)}); its files may be "
            "damaged"
        ) from None
    return {key.split(".", 1)[0] for key in metadata.state_dict_metadata}


def rng_state() -> dict[str, torch.Tensor]:
    state = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


@contextmanager
def _quiet_single_process() -> Iterator[None]:
    """DCP warns on every one-process save and load that it assumes one process, which is what
    no_dist says: kept out of the run's log."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable")
        yield
