"""The one shell of every console script: bad input exits 2 with one line, a bug exits 1 with
its traceback, every console script of pyproject.toml is built on it, and the local launcher
forks its CPU ranks (fresh interpreters where a GPU is in use)."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

from tpformer.cli.shell import console_script

REPO = Path(__file__).resolve().parents[2]


def test_usage_error_exits_2_with_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    @console_script
    def main() -> None:
        raise ValueError("parallel.tensor=3 must divide\n  model.num_heads=4 (1, 2, 4)")

    with pytest.raises(SystemExit) as exit_:
        main()
    assert exit_.value.code == 2
    assert (
        capsys.readouterr().err
        == "error: parallel.tensor=3 must divide model.num_heads=4 (1, 2, 4)\n"
    )


def test_a_bug_keeps_its_traceback() -> None:
    @console_script
    def main() -> None:
        raise KeyError("a bug, not bad input")

    with pytest.raises(KeyError, match="a bug"):
        main()


def test_every_console_script_is_on_the_shell() -> None:
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert {
        "tpformer-pretrain",
        "tpformer-finetune",
        "tpformer-plan",
        "tpformer-tokenizer",
        "tpformer-preprocess",
        "tpformer-convert",
    } <= set(scripts)
    for name, target in scripts.items():
        module, _, attr = target.partition(":")
        assert module.startswith("tpformer.cli."), f"{name} lives outside tpformer/cli: {target}"
        main = getattr(importlib.import_module(module), attr)
        assert getattr(main, "__wrapped__", None) is not None, f"{name} is not on console_script"


@pytest.mark.slow  # over ~5 s: the slow tier
def test_a_user_config_dir_composes_through_the_search_path(tmp_path: Path) -> None:
    """The package's configs are found through the package; `--config-dir` adds the user's."""
    (tmp_path / "parallel").mkdir()
    (tmp_path / "parallel" / "mine.yaml").write_text("tensor: 2\nzero_stage: 1\n")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "tpformer.cli.pretrain",
            "--config-dir",
            str(tmp_path),
            "parallel=mine",
            "--cfg",
            "job",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "tensor: 2" in result.stdout and "zero_stage: '1'" in result.stdout
    assert "seed: 1234" in result.stdout  # the rest of the group from the schema's defaults


def test_only_an_empty_default_run_directory_is_forgotten(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A config error removes the run directory Hydra made from its default pattern, and never
    one the user named (here: the working directory itself) or one holding anything."""
    from tpformer.cli.shell import _forget_run_dir

    monkeypatch.chdir(tmp_path)
    default = tmp_path / "outputs" / "2026-11-26" / "17-00-00"
    default.mkdir(parents=True)
    _forget_run_dir(default)
    assert not (tmp_path / "outputs").exists()
    _forget_run_dir(tmp_path)  # hydra.run.dir=. : kept
    assert tmp_path.is_dir()
    kept = tmp_path / "outputs" / "run"
    kept.mkdir(parents=True)
    (kept / "notes.txt").write_text("mine")
    _forget_run_dir(kept)
    assert (kept / "notes.txt").exists()


def test_ranks_are_forked_only_where_no_gpu_is_in_use(monkeypatch: pytest.MonkeyPatch) -> None:
    """A process that has looked for GPUs must not fork ranks that use them: with CUDA each
    rank is a fresh interpreter, as under torchrun (tests/faults/test_processes.py sees forked
    ranks on the CPU)."""
    import torch

    from tpformer.cli.forked_ranks import can_fork_ranks

    assert can_fork_ranks()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert not can_fork_ranks()


@pytest.mark.slow  # a 2-rank launch of fresh interpreters
def test_without_fork_the_ranks_are_fresh_interpreters(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The GPU path on the CPU: torch's launcher starts `python -u -m tpformer.cli.pretrain`
    per rank, and the run gives the forked ranks' losses to the last bit (dropout on)."""
    import json

    from torch.distributed.launcher import api

    from tests.cli.forked import run_script
    from tests.train.test_trainer import TINY
    from tpformer.cli import forked_ranks
    from tpformer.cli.launch import launch_local

    entry_points: list[object] = []
    launch = api.elastic_launch

    def recorded(config: api.LaunchConfig, entrypoint: object) -> api.elastic_launch:
        entry_points.append((config.start_method, entrypoint))
        return launch(config, entrypoint)  # type: ignore[arg-type]

    monkeypatch.setattr(api, "elastic_launch", recorded)
    monkeypatch.setattr(forked_ranks, "can_fork_ranks", lambda: False)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    overrides = [*TINY, "parallel.tensor=2", "trainer.max_steps=2", "trainer.log_every=1"]
    fresh, forked = tmp_path / "fresh", tmp_path / "forked"
    code = launch_local(
        "tpformer.cli.pretrain",
        [*overrides, f"hydra.run.dir={fresh}"],
        nproc_per_node=2,
        max_restarts=0,
        run_dir=fresh,
    )
    assert code == 0
    assert entry_points == [("spawn", sys.executable)]  # a command: `python -u -m ...` a rank
    done = run_script(  # the CPU path: forked ranks
        "tpformer.cli.pretrain",
        [*overrides, "launcher.nproc_per_node=2", f"hydra.run.dir={forked}"],
        cwd=tmp_path,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert done.returncode == 0, done.stderr[-3000:]

    def losses(run: Path) -> list[tuple[int, float]]:
        lines = (run / "metrics.jsonl").read_text().splitlines()
        return [(r["step"], r["loss"]) for r in map(json.loads, lines) if not r.get("eval")]

    assert [step for step, _ in losses(fresh)] == [1, 2]
    assert losses(forked) == losses(fresh)
