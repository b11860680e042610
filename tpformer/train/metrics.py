"""What a run reports: metrics.jsonl, TensorBoard scalars, the loss-curve PNG, FLOPs and MFU."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from tpformer.planner.cluster import KNOWN_PEAKS


def peak_tflops(given: float, precision: str) -> float:
    """trainer.peak_tflops, or the datasheet peak of a known GPU, or 0 (MFU not shown)."""
    if given > 0 or not torch.cuda.is_available():
        return given
    name = torch.cuda.get_device_name()
    dtype = "fp32" if precision == "fp32" else "bf16"
    return next((v for (gpu, d), v in KNOWN_PEAKS.items() if gpu in name and d == dtype), 0.0)


class MetricsWriter:
    """Rank 0 appends one JSON object per logged step to metrics.jsonl and mirrors it to
    TensorBoard; `close()` draws loss and LR against steps into loss_curve.png."""

    def __init__(self, run_dir: Path, *, enabled: bool) -> None:
        self.run_dir, self.enabled = run_dir, enabled
        self.path = run_dir / "metrics.jsonl"
        self.tb = None
        if enabled:
            from torch.utils.tensorboard import SummaryWriter

            self.tb = SummaryWriter(str(run_dir / "tensorboard"))

    def log(self, record: dict) -> None:
        if not self.enabled:
            return
        with self.path.open("a") as f:
            f.write(json.dumps(record) + "\n")
        prefix = "eval" if record.get("eval") else "train"
        for key, value in record.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool) and key != "step":
                self.tb.add_scalar(f"{prefix}/{key}", value, record["step"])

    def close(self) -> None:
        if not self.enabled:
            return
        self.tb.close()
        if self.path.exists():
            plot_loss_curve(self.path, self.run_dir / "loss_curve.png")


def plot_loss_curve(metrics: Path, png: Path) -> None:
    """Training loss (with its MLM/NSP parts) and evaluation against steps, from a
    metrics.jsonl; the right axis shows the LR, or the dev metrics when evaluation reports
    metrics rather than a loss (fine-tuning)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    train = [r for r in rows if not r.get("eval")]
    evals = [r for r in rows if r.get("eval")]
    fig, ax = plt.subplots(figsize=(8, 4.5))
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
    ax.legend(lines[0] + right_lines[0], lines[1] + right_lines[1], loc="upper right")
    fig.tight_layout()
    fig.savefig(png, dpi=100)
    plt.close(fig)
