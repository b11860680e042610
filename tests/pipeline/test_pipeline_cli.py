"""The issue's commands through the launcher, and bad pipeline settings refused before any
process starts (exit 2, one line naming the values)."""

import json
import re
from pathlib import Path

import pytest

from tests.cli.in_process import outcome, selected_cases
from tests.docs.commands import arguments, documented
from tests.tolerances import FP32_MODEL_REL
from tests.train.test_trainer import PRETRAIN, QUIET, _cli

MINI = [
    "model=bert_mini",
    "data=synthetic",
    "model.vocab_size=512",
    "data.seq_length=32",
    "trainer.micro_batch_size=2",
    "trainer.max_steps=3",
    "trainer.log_every=1",
    "trainer.progress=false",
    "trainer.eval_steps=1",
    *QUIET,
]


def _losses(run: Path) -> list[float]:
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return [x["loss"] for x in lines if not x.get("eval")]


@pytest.fixture(scope="module")
def one_process_losses(tmp_path_factory: pytest.TempPathFactory) -> list[float]:
    """The one-process run of MINI at grad_accum 4 that both pipeline commands are held to (run
    once for the module: a console-script run costs ~7 s of start-up)."""
    tmp_path = tmp_path_factory.mktemp("one")
    run = tmp_path / "run"
    result = _cli([*MINI, "trainer.grad_accum=4", f"hydra.run.dir={run}"], tmp_path, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    return _losses(run)


@pytest.mark.slow
def test_cli_pipeline_runs_give_the_one_process_losses(
    tmp_path: Path, one_process_losses: list[float]
) -> None:
    """model=bert_mini (dropout 0.1), grad_accum 4: one process, pipeline=2 on 2 processes and
    pipeline=2 x tensor=2 on 4."""
    losses = {"one": one_process_losses}
    for name, command in (  # docs/parallel/pipeline.md's commands, after MINI's sizes
        ("pp2", documented("tpformer-pretrain model=bert_mini parallel.pipeline=2 trainer")),
        ("pp2tp2", documented("tpformer-pretrain model=bert_mini parallel.pipeline=2 parallel.t")),
    ):
        run = tmp_path / name
        result = _cli(
            [*MINI, *arguments(command)[1], f"hydra.run.dir={run}"], tmp_path, timeout=600
        )
        assert result.returncode == 0, result.stderr[-3000:]
        losses[name] = _losses(run)
        if name == "pp2":
            assert "layout: world 2 = pp 2 x dp 1 x tp 1" in result.stderr
            assert "pipeline: 2 stages, schedule 1f1b, 4 micro-batches" in result.stderr
    for name in ("pp2", "pp2tp2"):
        assert len(losses[name]) == 3
        for got, want in zip(losses[name], losses["one"]):
            assert abs(got - want) <= FP32_MODEL_REL * want, losses


@pytest.mark.slow
def test_cli_pipedream_partition_chooses_replicas_and_runs(
    tmp_path: Path, one_process_losses: list[float]
) -> None:
    """parallel.pipeline_split=pipedream on 3 processes: the partitioner's choice is printed
    ("2-1" style) and is the layout the run takes; updating per step, the first step (no
    staleness yet) has the one-process loss."""
    _, argv = arguments(  # docs/parallel/pipeline.md's, updating per step
        documented("tpformer-pretrain model=bert_mini parallel.pipeline=2 parallel.pipeline_sche"
                   "dule=pipedream parallel.pipeline_split=pipedream")
    )  # fmt: skip
    run = tmp_path / "replicated"
    result = _cli(
        [*MINI, *argv, "parallel.pipedream_update=step", f"hydra.run.dir={run}"],
        tmp_path,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    chosen = re.search(r"pipedream partition: (\d-\d) \(workers per stage\)", result.stderr)
    assert chosen is not None, result.stderr[-3000:]
    assert f"layout: world 3 = pp 2 x replicas {chosen[1]} x tp 1" in result.stderr
    got, want = _losses(run), one_process_losses
    assert len(got) == 3 and abs(got[0] - want[0]) <= FP32_MODEL_REL * want[0], (got, want)


BAD_PIPELINE = [
    (
        "parallel.pipeline=3",
        "error: parallel.tensor=1 x parallel.pipeline=3 = 3 does not divide "
        "world_size=2; valid products are [1, 2]",
    ),
    (
        "parallel.pipeline=2 model.num_layers=1",
        "error: parallel.pipeline=2 exceeds the model's num_layers=1",
    ),
    (
        "parallel.pipeline=2 parallel.pipeline_layers=[3,2]",
        "error: parallel.pipeline_layers=[3, 2] sums to 5 layers; the model has model.num_layers=2",
    ),
    (
        "parallel.pipeline=2 parallel.pipeline_split=fastest",
        "error: parallel.pipeline_split=fastest is not one of balanced, profile, pipedream",
    ),
    (
        "parallel.pipeline=2 parallel.pipeline_schedule=interleaved_1f1b trainer.grad_accum=2",
        "error: parallel.pipeline_schedule=interleaved_1f1b splits the num_layers=2 layers "
        "into parallel.pipeline=2 x parallel.virtual_stages=2 equal chunks: it must be a "
        "multiple of 4",
    ),
    (
        "parallel.pipeline=2 parallel.pipeline_schedule=interleaved_1f1b model.num_layers=4",
        "error: parallel.pipeline_schedule=interleaved_1f1b needs the micro-batches per step "
        "(1) to "
        "be a multiple of parallel.pipeline=2",
    ),
    (
        "parallel.pipeline_schedule=pipedream",
        "error: parallel.pipeline_schedule=pipedream needs parallel.pipeline >= 2 (got 1)",
    ),
    (
        "parallel.pipeline=2 parallel.pipeline_schedule=pipedream parallel.pipeline_replicas=[2,1]",
        "error: parallel.pipeline_replicas=[2, 1] uses 3 workers but world_size=2",
    ),
    (
        "parallel.pipeline=auto parallel.pipeline_schedule=pipedream "
        "parallel.pipeline_split=pipedream",
        "error: parallel.pipeline=auto: the planner chooses regular layouts; with "
        "replicated pipeline stages",
    ),
    (
        "parallel.pipeline=2 parallel.pipeline_replicas=[1,1]",
        "error: parallel.pipeline_replicas=[1, 1] replicates pipeline stages, which only "
        "the asynchronous schedule runs",
    ),
    (
        "parallel.pipeline=2 parallel.zero_stage=2",
        "error: parallel.zero_stage=2 is not supported with parallel.pipeline=2",
    ),
]


def _bad_pipeline_argv(override: str) -> list[str]:
    return [
        "model=bert_tiny",
        "data=synthetic",
        "trainer.progress=false",
        *override.split(),
        "launcher.nproc_per_node=2",
    ]


@pytest.mark.sweep
@pytest.mark.parametrize(("override", "message"), BAD_PIPELINE)
def test_bad_pipeline_settings_exit_2_with_one_line(
    override: str, message: str, request: pytest.FixtureRequest
) -> None:
    table = [_bad_pipeline_argv(case["override"]) for case in selected_cases(request)]
    result = outcome(PRETRAIN, _bad_pipeline_argv(override), table, request)
    assert result.code == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(message) and not result.left, result
