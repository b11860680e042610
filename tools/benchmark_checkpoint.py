"""How long a checkpoint save stalls training, synchronous against asynchronous.

    python tools/benchmark_checkpoint.py                  # bert_small, seq 128, micro-batch 8
    python tools/benchmark_checkpoint.py --model bert_base --steps 4

One process, synthetic data. For each mode (trainer.async_save=false, then true) the same
model trains: the mean time of plain steps, then a save followed by the same number of steps.
The stall is that stretch's time minus the plain steps' time: the whole write when synchronous;
the host copy plus the background write's share of the cores when asynchronous. `in save()` is
how long the save call itself held the training thread.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch

from tpformer.config.presets import preset
from tpformer.config.schema import Config, DataConfig, DataSource, OptimConfig, TrainerConfig
from tpformer.data.steps import prepare_step
from tpformer.parallel.context import ParallelContext
from tpformer.train.loop import Trainer
from tpformer.train.pretraining import pretraining_trainer


def _config(model: str, background: bool) -> Config:
    return Config(
        model=replace(preset(model), vocab_size=8000),
        optim=OptimConfig(lr=1e-4, warmup_steps=1),
        data=DataConfig(source=DataSource.synthetic, seq_length=128, num_workers=0),
        trainer=TrainerConfig(
            max_steps=1000, micro_batch_size=8, progress=False, async_save=background
        ),
    )


def _step(trainer: Trainer, step: int) -> None:
    prepared = prepare_step(trainer.task.train_batches, trainer.task.objective, step)
    trainer.queue_step(prepared, train=True)
    trainer.engine.step()


def measure(model: str, background: bool, steps: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        trainer = pretraining_trainer(
            _config(model, background), ParallelContext.single(device="cpu"), Path(tmp)
        )
        for s in range(2):  # warm-up
            _step(trainer, s)
        start = time.perf_counter()
        for s in range(2, 2 + steps):
            _step(trainer, s)
        plain = (time.perf_counter() - start) / steps
        start = time.perf_counter()
        saved = trainer.save(2 + steps)
        in_save = time.perf_counter() - start
        for s in range(2 + steps, 2 + 2 * steps):
            _step(trainer, s)
        stretch = time.perf_counter() - start
        trainer.checkpoints.writer.close()
        written = time.perf_counter() - start
        size = sum(f.stat().st_size for f in saved.rglob("*") if f.is_file())
    return {
        "step_s": plain,
        "in_save_s": in_save,
        "stall_s": stretch - steps * plain,
        "written_after_s": written,
        "size_mb": size / 1e6,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="bert_small")
    parser.add_argument("--steps", type=int, default=6)
    args = parser.parse_args()
    torch.manual_seed(0)
    rows = {mode: measure(args.model, mode == "async", args.steps) for mode in ("sync", "async")}
    print(f"{args.model}, seq 128, micro-batch 8, {torch.get_num_threads()} threads, one process")
    print("| mode | step (s) | checkpoint (MB) | in save() (s) | stall (s) | stall / step |")
    print("|---|---|---|---|---|---|")
    for mode, r in rows.items():
        print(
            f"| {mode} | {r['step_s']:.3f} | {r['size_mb']:.0f} | {r['in_save_s']:.3f} | "
            f"{r['stall_s']:.3f} | {r['stall_s'] / r['step_s']:.2f} |"
        )
    ratio = rows["async"]["stall_s"] / max(rows["sync"]["stall_s"], 1e-9)
    print(f"async stall / sync stall: {ratio:.2f}")


if __name__ == "__main__":
    main()
