"""What a run reports: metrics.jsonl, TensorBoard scalars, the loss-curve PNG, FLOPs and MFU."""

from __future__ import annotations

import json
import os
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from tpformer import device_peaks


def peak_tflops(given: float, precision: str) -> float:
    """trainer.peak_tflops, or the datasheet peak of a known GPU (device_peaks.py), or 0 (MFU
    not shown)."""
    if given > 0 or not torch.cuda.is_available():
        return given
    props = torch.cuda.get_device_properties()
    return device_peaks.peak_tflops(props.name, props.multi_processor_count, precision)


@dataclass(frozen=True)
class RankTimes:
    """Each rank's own step time in seconds (its waits for peers excluded), by global rank: in
    a synchronous step the wall time is everyone's, this is what tells the slow rank."""

    seconds: list[float]

    @property
    def slowest(self) -> int:
        return max(range(len(self.seconds)), key=self.seconds.__getitem__)

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)

    def lag(self) -> float:
        """How far the slowest rank is above the median, as a fraction (0 on one rank)."""
        median = self.median
        return max(self.seconds) / median - 1 if median > 0 and len(self.seconds) > 1 else 0.0

    def metrics(self) -> dict[str, float]:
        return {
            "slowest_rank": self.slowest,
            "slowest_rank_step_s": max(self.seconds),
            "median_rank_step_s": self.median,
        }


class TensorBoardSink:
    """Scalars into <run dir>/tensorboard."""

    def __init__(self, run_dir: Path) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(str(run_dir / "tensorboard"))

    def scalars(self, values: dict[str, float], step: int) -> None:
        for key, value in values.items():
            self.writer.add_scalar(key, value, step)

    def close(self) -> None:
        self.writer.close()


class WandbSink:
    """Scalars and the composed config into a Weights & Biases run (its files under <run dir>/
    wandb). The environment configures it as wandb documents: WANDB_PROJECT (default
    "tpformer"), WANDB_ENTITY, WANDB_MODE=offline for a run that never touches the network."""

    def __init__(self, run_dir: Path, config: dict[str, Any]) -> None:
        import wandb

        self.run = wandb.init(
            project=os.environ.get("WANDB_PROJECT", "tpformer"),
            dir=str(run_dir),
            name=run_dir.name,
            config=config,
        )

    def scalars(self, values: dict[str, float], step: int) -> None:
        self.run.log(values, step=step)

    def close(self) -> None:
        self.run.finish()


class MetricsWriter:
    """Rank 0 appends one JSON object per logged step to metrics.jsonl and sends its numbers to
    each of trainer.loggers as train/<key> or eval/<key>; `close()` draws loss and LR against
    steps into loss_curve.png (trainer.plot)."""

    def __init__(
        self,
        run_dir: Path,
        *,
        enabled: bool,
        loggers: list[str] | tuple[str, ...] = ("tensorboard",),
        plot: bool = True,
        config: dict[str, Any] | None = None,
    ) -> None:
        self.run_dir, self.enabled, self.plot = run_dir, enabled, plot
        self.path = run_dir / "metrics.jsonl"
        self.sinks: list[TensorBoardSink | WandbSink] = []
        if enabled:
            run_dir.mkdir(parents=True, exist_ok=True)
            if "tensorboard" in loggers:
                self.sinks.append(TensorBoardSink(run_dir))
            if "wandb" in loggers:
                self.sinks.append(WandbSink(run_dir, config or {}))

    def log(self, record: dict[str, Any]) -> None:
        if not self.enabled:
            return
        with self.path.open("a") as f:
            f.write(json.dumps(record) + "\n")
        prefix = "eval" if record.get("eval") else "train"
        values = {
            f"{prefix}/{key}": value
            for key, value in record.items()
            if isinstance(value, (int, float)) and not isinstance(value, bool) and key != "step"
        }
        for sink in self.sinks:
            sink.scalars(values, record["step"])

    def close(self) -> None:
        if not self.enabled:
            return
        for sink in self.sinks:
            sink.close()
        if self.plot and self.path.exists():
            plot_loss_curve(self.path, self.run_dir / "loss_curve.png")


def plot_loss_curve(metrics: Path, png: Path) -> None:
    """Training loss (with its MLM/NSP parts) and evaluation against steps, from a
    metrics.jsonl; the right axis shows the LR, or the dev metrics when evaluation reports
    metrics rather than a loss (fine-tuning). Pretraining adds a panel of the MLM/NSP
    accuracies, train and held-out: where a loss flattens, they show what is being learned."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    train = [r for r in rows if not r.get("eval")]
    evals = [r for r in rows if r.get("eval")]
    accuracies = [k for k in (train[0] if train else {}) if k.endswith("_accuracy")]
    if accuracies:
        fig, (ax, acc_ax) = plt.subplots(
            2, 1, figsize=(8, 7.5), layout="constrained", sharex=True, height_ratios=[3, 2]
        )
        _plot_accuracies(acc_ax, train, evals, accuracies)
    else:
        fig, ax = plt.subplots(figsize=(8, 5), layout="constrained")
    ax.plot([r["step"] for r in train], [r["loss"] for r in train], label="train loss")
    for part in ("mlm_loss", "nsp_loss"):
        if train and part in train[0]:
            ax.plot(
                [r["step"] for r in train],
                [r[part] for r in train],
                lw=0.8,
                alpha=0.7,
                label=f"train {part.split('_')[0].upper()}",
            )
    if evals and "loss" in evals[0]:
        ax.plot([r["step"] for r in evals], [r["loss"] for r in evals], "o-", label="eval loss")
    if not accuracies:
        ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.grid(alpha=0.3)
    right = ax.twinx()
    dev = [k for k in (evals[0] if evals else {}) if k not in ("step", "epoch", "eval")]
    if evals and "loss" not in evals[0]:
        for key in dev:
            right.plot(
                [r["step"] for r in evals], [r[key] for r in evals], "o--", label=f"dev {key}"
            )
        right.set_ylabel("dev metric")
    else:
        right.plot(
            [r["step"] for r in train], [r["lr"] for r in train], color="gray", ls="--", label="lr"
        )
        right.set_ylabel("learning rate")
    lines = ax.get_legend_handles_labels()
    right_lines = right.get_legend_handles_labels()
    handles, labels = lines[0] + right_lines[0], lines[1] + right_lines[1]
    # below the axes, so it never covers the end of a curve
    fig.legend(handles, labels, loc="outside lower center", ncol=min(len(labels), 4), fontsize=9)
    fig.savefig(png, dpi=100)
    plt.close(fig)


def _plot_accuracies(
    ax: Any, train: list[dict[str, Any]], evals: list[dict[str, Any]], keys: list[str]
) -> None:
    for key in keys:
        name = key.split("_")[0].upper()
        line = ax.plot(
            [r["step"] for r in train], [r[key] for r in train], lw=0.8, label=f"train {name}"
        )[0]
        if evals and key in evals[0]:
            ax.plot(
                [r["step"] for r in evals],
                [r[key] for r in evals],
                "o-",
                color=line.get_color(),
                label=f"eval {name}",
            )
    ax.set_xlabel("step")
    ax.set_ylabel("accuracy")
    ax.grid(alpha=0.3)
    ax.legend(loc="center left", fontsize=9, ncol=2)
