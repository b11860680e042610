"""The Python API (tpformer/api.py) and callbacks (train/callbacks.py) as a user runs them:
examples/python_api/train_evaluate_export.py trains, evaluates and exports in one process and,
under torchrun at TP=2, gives the one-process losses (1e-5); a callback's learning rate is the
one the step took, a callback's stop ends the run on every rank with a checkpoint of that step,
and compose_config refuses a typo as the console script does."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.docs.commands import arguments, documented
from tests.tolerances import FP32_MODEL_REL
from tests.train.test_trainer import REPO

ENV = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}


def _python(*argv: str, cwd: Path) -> subprocess.CompletedProcess:
    done = subprocess.run(
        [sys.executable, *argv], cwd=cwd, env=ENV, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return done


def _losses(run: Path) -> dict[int, float]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in rows if not r.get("eval")}


@pytest.fixture(scope="module")
def one_process(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """docs/python-api.md's command, into this test's directory."""
    run = tmp_path_factory.mktemp("api") / "run"
    command = documented("python examples/python_api/train_evaluate_export.py")
    _, argv = arguments(command, {"examples/": f"{REPO}/examples/", "runs/api": str(run)})
    done = _python(*argv, cwd=run.parent)
    return run, done.stdout


@pytest.mark.slow  # the example's run, a console-script-sized subprocess
def test_the_example_trains_evaluates_and_exports(one_process: tuple[Path, str]) -> None:
    import transformers

    from tpformer.config.schema import OptimConfig
    from tpformer.train.schedule import lr_at

    run, stdout = one_process
    assert "trained 40 steps" in stdout and f"exported step00000040 to {run / 'hf'}" in stdout
    rows = list(csv.DictReader((run / "loss.csv").open()))
    assert [int(r["step"]) for r in rows] == [1, *range(5, 41, 5)]  # the logged steps
    losses = _losses(run)
    assert all(float(r["loss"]) == pytest.approx(losses[int(r["step"])], rel=1e-6) for r in rows)
    optim = OptimConfig()  # the example's lr comes from optim's defaults, halved from step 30
    for row in rows:
        step = int(row["step"])  # its record's lr: the last step of the logged window's
        want = lr_at(step - 1, peak=optim.lr, optim=optim, max_steps=40)
        want = want / 2 if step - 1 >= 30 else want
        assert float(row["lr"]) == pytest.approx(want, rel=1e-3), row
    evals = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in evals if r.get("eval")] == [10, 20, 30, 40]
    assert (run / ".hydra" / "config.yaml").is_file() and (run / "train.log").is_file()
    model = transformers.BertForPreTraining.from_pretrained(run / "hf")
    assert model.config.num_hidden_layers == 2 and model.config.hidden_size == 128


@pytest.mark.slow  # a torchrun launch of 2 ranks
def test_under_torchrun_tp2_gives_the_one_process_losses(
    one_process: tuple[Path, str], tmp_path: Path
) -> None:
    """docs/python-api.md's torchrun command, its rendezvous --standalone (a free port: tests
    run side by side), into this test's directory."""
    run = tmp_path / "tp2"
    command = documented("torchrun --nproc-per-node 2 examples/python_api/")
    _, argv = arguments(command, {"examples/": f"{REPO}/examples/", "runs/api_tp2": str(run)})
    done = _python("-m", "torch.distributed.run", "--standalone", *argv, cwd=tmp_path)
    assert "world 2 = dp 1 x tp 2" in done.stderr
    want, got = _losses(one_process[0]), _losses(run)
    assert got.keys() == want.keys()
    for step, loss in got.items():
        assert abs(loss - want[step]) <= FP32_MODEL_REL * abs(want[step]), (step, loss)
    assert (run / "hf" / "config.json").is_file()


STOPPING = """
import sys, tpformer

class StopAt(tpformer.Callback):
    def on_evaluate(self, run, step, metrics):
        self.seen = step
        if step == 20:
            run.stop()

class Saves(tpformer.Callback):
    saved = []
    def on_save(self, run, step, path):
        self.saved.append((step, path.name))
    def on_train_end(self, run, records):
        print("SAVED", self.saved, "LAST", records[-1]["step"], "AT", run.step)

config = tpformer.compose_config("pretrain", "model=bert_tiny", "data=synthetic",
    "trainer.max_steps=100", "trainer.micro_batch_size=4", "data.seq_length=32",
    "trainer.eval_every=10", "trainer.save_every=50", "trainer.progress=false",
    "trainer.plot=false", "trainer.log_every=5", *sys.argv[2:])
tpformer.pretrain(config, sys.argv[1], callbacks=[StopAt(), Saves()])
"""


@pytest.mark.slow  # a subprocess run
def test_a_callback_stops_the_run_with_a_checkpoint_of_its_step(tmp_path: Path) -> None:
    done = _python("-c", STOPPING, str(tmp_path / "run"), cwd=tmp_path)
    assert "SAVED [(20, 'step00000020')] LAST 20 AT 20" in done.stdout, done.stdout
    stop = json.loads((tmp_path / "run" / "stop.json").read_text())
    assert stop["reason"] == "callback" and stop["step"] == 20, stop
    assert "a callback: saved step 20 and stopping" in done.stderr


def test_compose_config_refuses_a_typo_and_an_unknown_job() -> None:
    import tpformer

    with pytest.raises(ValueError, match=r"did you mean parallel\.tensor"):
        tpformer.compose_config("pretrain", "parallel.tensr=2")
    with pytest.raises(ValueError, match="one of pretrain, finetune"):
        tpformer.compose_config("generate")
    config = tpformer.compose_config("finetune", "task=rte", "init=x", "parallel.tensor=2")
    assert config.task.value == "rte" and config.parallel.tensor == 2


def test_what_only_the_console_scripts_do_is_refused(tmp_path: Path) -> None:
    import tpformer

    config = tpformer.compose_config("pretrain", "launcher.nproc_per_node=2")
    with pytest.raises(ValueError, match="start the ranks with torchrun --nproc-per-node N"):
        tpformer.pretrain(config, tmp_path / "run")
    config = tpformer.compose_config("finetune", "task=rte", "init=x", "dry_run.world=8")
    with pytest.raises(ValueError, match=r"dry_run\.world=8: the dry run is the console"):
        tpformer.finetune(config, tmp_path / "run")
    assert not (tmp_path / "run").exists()
