"""trainer.loggers: metrics.jsonl always; TensorBoard and Weights & Biases (offline, nothing
sent) get the same scalars, W&B also the composed config."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.train.wandb_files import history_and_config
from tpformer.config.rules.trainer import validate_loggers
from tpformer.config.schema import FinetuneTrainerConfig, TrainerConfig
from tpformer.train.metrics import MetricsWriter

RECORDS = [
    {"step": 10, "loss": 7.5, "mlm_accuracy": 0.05, "lr": 1e-4, "skipped": 0.0},
    {"step": 20, "loss": 6.25, "mlm_accuracy": 0.125, "lr": 2e-4, "skipped": 0.0},
    {"step": 20, "loss": 6.5, "mlm_accuracy": 0.1, "eval": True},
]


def test_wandb_gets_the_tensorboard_scalars_and_the_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    config = {"model": {"hidden_size": 64}, "parallel": {"tensor": 2, "zero_stage": 1}}
    writer = MetricsWriter(tmp_path, enabled=True, loggers=["tensorboard", "wandb"], config=config)
    for record in RECORDS:
        writer.log(record)
    writer.close()

    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert lines == RECORDS
    assert any((tmp_path / "tensorboard").iterdir())
    (run_file,) = tmp_path.glob("wandb/offline-run-*/run-*.wandb")
    rows, logged_config = history_and_config(run_file)
    expected = {}  # what TensorBoard gets: train/<key> and eval/<key>, per step
    for r in RECORDS:
        prefix = "eval" if r.get("eval") else "train"
        values = {f"{prefix}/{k}": v for k, v in r.items() if k not in ("step", "eval")}
        expected.setdefault(r["step"], {}).update(values)
    got: dict[str, float] = {}
    for row in rows:
        got.update(row)
    assert got == {k: v for values in expected.values() for k, v in values.items()}
    assert logged_config["model"] == {"hidden_size": 64}
    assert logged_config["parallel"] == {"tensor": 2, "zero_stage": 1}
    assert (tmp_path / "loss_curve.png").stat().st_size > 1000


def test_no_loggers_writes_metrics_jsonl_alone(tmp_path: Path) -> None:
    """trainer.loggers=[] and trainer.plot=false (the default draws the plot, above)."""
    writer = MetricsWriter(tmp_path, enabled=True, loggers=[], plot=False)
    writer.log(RECORDS[0])
    writer.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.jsonl"]
    assert json.loads((tmp_path / "metrics.jsonl").read_text()) == RECORDS[0]
    assert TrainerConfig().plot and FinetuneTrainerConfig().plot


def test_default_is_tensorboard_and_a_missing_wandb_is_named(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert [str(x) for x in TrainerConfig().loggers] == ["tensorboard"]
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a)
    )
    with pytest.raises(ValueError, match=r"pip install 'tpformer\[wandb\]'"):
        validate_loggers(["tensorboard", "wandb"])
