"""Train, evaluate and export from Python, with callbacks (the Python API, docs/python-api.md).

    python examples/python_api/train_evaluate_export.py runs/api
    torchrun --nproc-per-node 2 examples/python_api/train_evaluate_export.py runs/api_tp2 \
        parallel.tensor=2

Extra arguments are Hydra overrides, as on the command line. The run: a tiny BERT on synthetic
data with an evaluation every 10 steps; one callback writes the logged losses to loss.csv (rank
0), another stops the run when the evaluation loss has not improved for `patience` evaluations
and a third halves the schedule's learning rate after step 30. Then the latest checkpoint is
exported to a Hugging Face directory (rank 0) and its path printed."""

from __future__ import annotations

import csv
import sys
from pathlib import Path
from typing import Any

import tpformer


class LossCsv(tpformer.Callback):
    """Every logged step's loss and learning rate into <run dir>/loss.csv (another tracker)."""

    def on_step_end(self, run: tpformer.Run, step: int, metrics: dict[str, Any] | None) -> None:
        if metrics is None or not run.is_main:
            return
        path = run.run_dir / "loss.csv"
        new = not path.exists()
        with path.open("a", newline="") as file:
            writer = csv.writer(file)
            if new:
                writer.writerow(["step", "loss", "lr"])
            writer.writerow([step, f"{metrics['loss']:.6f}", f"{metrics['lr']:.3e}"])


class StopOnPlateau(tpformer.Callback):
    """Stop when the evaluation loss has not improved by min_delta for `patience` evaluations."""

    def __init__(self, patience: int = 2, min_delta: float = 0.0) -> None:
        self.patience, self.min_delta = patience, min_delta
        self.best, self.waited = float("inf"), 0

    def on_evaluate(self, run: tpformer.Run, step: int, metrics: dict[str, float]) -> None:
        if metrics["loss"] < self.best - self.min_delta:
            self.best, self.waited = metrics["loss"], 0
            return
        self.waited += 1
        if self.waited >= self.patience:
            run.stop()


class HalveLrAfter(tpformer.Callback):
    """The schedule's learning rate, halved from step `after` on."""

    def __init__(self, after: int) -> None:
        self.after = after

    def lr(self, run: tpformer.Run, step: int, lr: float) -> float:
        return lr / 2 if step >= self.after else lr


def main(run_dir: str, *overrides: str) -> Path | None:
    config = tpformer.compose_config(
        "pretrain",
        "model=bert_tiny",
        "data=synthetic",
        "trainer.max_steps=40",
        "trainer.micro_batch_size=8",
        "data.seq_length=32",
        "trainer.log_every=5",
        "trainer.eval_every=10",
        "trainer.save_every=20",
        "trainer.progress=false",
        "trainer.plot=false",
        *overrides,
    )
    callbacks = [LossCsv(), StopOnPlateau(patience=2, min_delta=1e-3), HalveLrAfter(30)]
    records = tpformer.pretrain(config, run_dir, callbacks=callbacks)
    latest = Path(run_dir) / "checkpoints"
    step_dir = latest / (latest / "latest").read_text().strip()
    print(f"trained {records[-1]['step']} steps, last logged loss {records[-1]['loss']:.4f}")
    import torch.distributed as dist

    if dist.is_initialized() and dist.get_rank() != 0:
        return None
    from tpformer.convert import to_hf

    exported = to_hf(step_dir, Path(run_dir) / "hf")
    print(f"exported {step_dir.name} to {exported}")
    return Path(exported)


if __name__ == "__main__":
    main(*sys.argv[1:])
