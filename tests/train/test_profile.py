"""trainer.profile writes a torch.profiler trace per traced rank into <run dir>/profile/, its
window in the loop's step numbers, with tpformer's regions labelled: forward and backward per
micro-batch, the optimizer, the data wait, each collective with its group, each pipeline
action. The losses are those of an unprofiled run (profiling observes, it does not change)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from tests.dist import run_distributed
from tests.train.test_trainer import tiny_config
from tpformer.config.schema import Config, ProfileConfig
from tpformer.parallel.context import ParallelContext
from tpformer.train.pretraining import pretraining_trainer


def _profiled(config: Config, **profile: object) -> Config:
    trainer = replace(config.trainer, profile=ProfileConfig(**profile))  # type: ignore[arg-type]
    return replace(config, trainer=trainer)


def _labels(trace: Path) -> set[str]:
    events = json.loads(trace.read_text())["traceEvents"]
    return {e["name"] for e in events if e.get("name", "").startswith("tpformer/")}


def _train(ctx: ParallelContext, config: Config, run_dir: str) -> list[float]:
    return [r["loss"] for r in pretraining_trainer(config, ctx, Path(run_dir)).train()]


def test_a_single_process_trace_names_the_steps_parts(tmp_path: Path) -> None:
    config = tiny_config(steps=4, accum=2)
    plain = _train(ParallelContext.single(device="cpu"), config, str(tmp_path / "plain"))
    profiled = _profiled(config, start=2, steps=2, warmup=1)
    run = tmp_path / "run"
    assert _train(ParallelContext.single(device="cpu"), profiled, str(run)) == plain
    labels = _labels(run / "profile" / "rank0.pt.trace.json")
    assert {"tpformer/forward 0", "tpformer/forward 1", "tpformer/backward 1"} <= labels
    assert {"tpformer/optimizer", "tpformer/data wait"} <= labels


def test_a_window_the_run_has_passed_writes_nothing(tmp_path: Path) -> None:
    import torch

    from tpformer.train.profiling import StepProfiler

    config = ProfileConfig(start=2, steps=2, warmup=1)
    late = StepProfiler(config, tmp_path, 0, torch.device("cpu"), first=1)  # resumed at step 2
    assert not late.active
    other_rank = StepProfiler(config, tmp_path, 1, torch.device("cpu"), first=0)
    assert not other_rank.active  # ranks=[0]
    late.close()
    other_rank.close()


@pytest.mark.slow
def test_every_rank_traces_its_collectives_and_pipeline_actions(tmp_path: Path) -> None:
    """TP=2 (all-reduces on the tp group), then pipeline=2 (its actions), each on 2 ranks."""
    window = {"start": 2, "steps": 1, "ranks": []}
    config = _profiled(tiny_config(steps=3, micro=4, accum=2, tensor=2), **window)
    run_distributed(_train, 2, config, str(tmp_path / "tp"), tensor=2)
    for rank in (0, 1):
        labels = _labels(tmp_path / "tp" / "profile" / f"rank{rank}.pt.trace.json")
        assert "tpformer/forward 1" in labels
        assert any(label.startswith("tpformer/all_reduce tp") for label in labels)  # tp/control
    config = _profiled(tiny_config(steps=3, micro=4, accum=2, pipeline=2), **window)
    run_distributed(_train, 2, config, str(tmp_path / "pp"), pipeline=2)
    labels = _labels(tmp_path / "pp" / "profile" / "rank1.pt.trace.json")
    assert {"tpformer/F micro 0 chunk 0", "tpformer/B micro 1 chunk 0"} <= labels
