"""The Python API: the console scripts' jobs from a script or a notebook, with callbacks.

    import tpformer

    config = tpformer.compose_config("pretrain", "model=bert_tiny", "data=synthetic",
                                     "trainer.max_steps=20")
    records = tpformer.pretrain(config, "runs/api", callbacks=[MyCallback()])

`compose_config` composes the typed config as the console script does (the same Hydra files,
the same checks of the overrides); the config is a plain dataclass to change further
(`dataclasses.replace`). `pretrain` and `finetune` run the job the console scripts run on a
rank -- the same layout resolution and validation, the same run directory (train.log,
metrics.jsonl, checkpoints, the config saved under .hydra/), the same trainer -- in this process,
or on every rank when the script runs under `torchrun --nproc-per-node N` (the layout keys then
split that world). `launcher.nproc_per_node` is the console scripts' way to start ranks; here
torchrun starts them. Bad input raises (ValueError, FileNotFoundError) instead of exiting.
Callbacks: tpformer.train.callbacks."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from tpformer.config.schema import Config, FinetuneConfig
from tpformer.train.callbacks import Callback, Run

__all__ = ["Callback", "Run", "compose_config", "finetune", "pretrain"]

JOBS = {"pretrain": ("config", Config), "finetune": ("finetune", FinetuneConfig)}
"""job -> (its Hydra config file, its schema)."""


def compose_config(job: str, *overrides: str) -> Any:
    """The typed config of `tpformer-<job> overrides...` (job: pretrain or finetune)."""
    from tpformer.config.overrides import compose_typed
    from tpformer.config.renamed import check_renamed

    if job not in JOBS:
        raise ValueError(f"job={job!r}: one of {', '.join(JOBS)}")
    name, schema = JOBS[job]
    check_renamed(list(overrides))
    return compose_typed(name, schema, overrides)


def pretrain(
    config: Config, run_dir: str | Path, *, callbacks: Sequence[Callback] = ()
) -> list[dict]:
    """Pretrain as `tpformer-pretrain` does; returns the logged training records."""
    from tpformer.cli.inputs import prepare_pretrain
    from tpformer.cli.pretrain import pretrain as job
    from tpformer.config.validate import validate

    return _run(config, Path(run_dir), validate, prepare_pretrain, job, callbacks)


def finetune(
    config: FinetuneConfig, run_dir: str | Path, *, callbacks: Sequence[Callback] = ()
) -> dict:
    """Fine-tune as `tpformer-finetune` does; returns results.json's contents."""
    from tpformer.cli.finetune import finetune as job
    from tpformer.cli.inputs import prepare_finetune
    from tpformer.config.validate import validate_finetune

    return _run(config, Path(run_dir), validate_finetune, prepare_finetune, job, callbacks)


def _run(
    config: Any,
    run_dir: Path,
    check: Callable[..., None],
    prepare: Callable[..., list[str]],
    job: Callable[..., Any],
    callbacks: Sequence[Callback],
) -> Any:
    """The console scripts' rank-side path (cli/shell.py) for a typed config."""
    import logging

    from omegaconf import OmegaConf

    from tpformer.cli.shell import checked_layout, dry_world, rank_context, shared_run_dir
    from tpformer.config.rules.choices import check_choices
    from tpformer.parallel.env import LaunchEnv

    env = LaunchEnv.read()
    if dry_world(config):
        raise ValueError(
            f"dry_run.world={config.dry_run.world}: the dry run is the console scripts' "
            "(tpformer-finetune dry_run.world=N, tpformer-plan plan.dry_run=true); from "
            "Python, train"
        )
    if config.launcher.nproc_per_node > 1 and not env.under_launcher:
        raise ValueError(
            f"launcher.nproc_per_node={config.launcher.nproc_per_node}: from Python, start the "
            "ranks with torchrun --nproc-per-node N (the console scripts start them themselves)"
        )
    check_choices(config)
    notes = prepare(config, [], run_dir)
    layout, layout_notes = checked_layout(config, env.world_size, env.local_world_size, check)
    ctx = rank_context(config, layout, env, run_dir)
    try:
        shared = shared_run_dir(OmegaConf.structured(config), [], run_dir, ctx)
        for line in notes + layout_notes:
            logging.getLogger("tpformer").info("%s", line)
        return job(config, ctx, shared, callbacks)
    finally:
        ctx.destroy()
