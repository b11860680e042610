"""Background batch building changes nothing: every logged value of a run with data workers
equals the run that builds its batches in line, at TP=1, TP=2, DP=2 and pipeline=2, and a run
stopped and resumed with workers continues the uninterrupted one exactly."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from tests.dist import run_distributed
from tests.train.test_trainer import tiny_config
from tpformer.config.schema import Config
from tpformer.parallel.context import ParallelContext
from tpformer.train.pretraining import pretraining_trainer

TIMING = {
    "data_wait_s",
    "tokens_per_s",
    "tflops_per_device",
    "mfu",
    "slowest_rank",
    "slowest_rank_step_s",
    "median_rank_step_s",
}
"""Wall-clock values: the only ones allowed to differ."""


def _with(config: Config, workers: int, **trainer: object) -> Config:
    return replace(
        config,
        data=replace(config.data, num_workers=workers, prefetch_steps=3),
        trainer=replace(config.trainer, **trainer),
    )


def _records(ctx: ParallelContext, config: Config, run_dir: str) -> list[dict]:
    records = pretraining_trainer(config, ctx, Path(run_dir)).train()
    return [{k: v for k, v in r.items() if k not in TIMING} for r in records]


def _stop_and_resume(ctx: ParallelContext, config: Config, run_dir: str) -> list[dict]:
    """Steps 0-2, saved and stopped by exit_at_step; then a new trainer resumes to the end."""
    first = _records(ctx, _with(config, 2, exit_at_step=3, save_every=3), run_dir)
    return first + _records(ctx, _with(config, 2, resume="auto", save_every=3), run_dir)


LAYOUTS = {
    "tp1": ({}, 1),
    "dp2": ({"data": 2}, 2),
    "tp2": ({"tensor": 2}, 2),
    "pp2": ({"pipeline": 2}, 2),
}


@pytest.mark.sweep
@pytest.mark.parametrize(
    "layout",
    ["tp1", "dp2", pytest.param("tp2", marks=pytest.mark.slow), "pp2"],
)
def test_two_workers_log_what_in_line_batches_log(tmp_path: Path, layout: str) -> None:
    parallel, world = LAYOUTS[layout]
    config = tiny_config(steps=5, micro=4, accum=2, **parallel)
    runs = []
    for workers in (0, 2):
        run = _with(config, workers)
        directory = str(tmp_path / f"w{workers}")
        if world == 1:
            runs.append([_records(ParallelContext.single(device="cpu"), run, directory)])
        else:
            runs.append(
                run_distributed(
                    _records,
                    world,
                    run,
                    directory,
                    tensor=parallel.get("tensor", 1),
                    pipeline=parallel.get("pipeline", 1),
                )
            )
    inline, background = runs
    assert inline[0] and [r["step"] for r in inline[0]] == [1, 2, 3, 4, 5]
    assert background == inline


def test_stop_and_resume_with_workers_equals_the_uninterrupted_run(tmp_path: Path) -> None:
    config = tiny_config(steps=6, micro=4, accum=1, data=2)
    whole = run_distributed(_records, 2, _with(config, 2), str(tmp_path / "whole"))
    resumed = run_distributed(_stop_and_resume, 2, config, str(tmp_path / "resumed"))
    assert [r["step"] for r in resumed[0]] == [1, 2, 3, 4, 5, 6]
    assert resumed == whole
