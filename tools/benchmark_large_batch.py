"""The README main job under large-batch optimizers or compressed gradient reduction: runs the
jobs one after another through `tpformer-pretrain` and plots their loss curves in one figure.

    python tools/benchmark_large_batch.py optimizers --out examples/bert_pretrain/large_batch.png
    python tools/benchmark_large_batch.py compression --out examples/bert_pretrain/compression.png

optimizers   AdamW at the main job's global batch 32 (500 steps), then AdamW, LAMB, LARS and
             NovoGrad at 4x the batch (128, 125 steps: the same samples) with optim.lr_scaling
             =sqrt from base_batch_size 32 and each optimizer's own base learning rate.
compression  the main job at DP=2 (tensor=1, 2 processes x 16 sequences: the same global batch
             32) with parallel.grad_compression none, bf16 and powersgd; the final losses
             against none's.
Both print the loss at the last step (mean of the last 5 logged steps) and its ratio to the
first run's, and write the plot (x: training samples, so batch sizes compare).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

MAIN_JOB = [
    "model=bert_mini",
    "model.vocab_size=8000",
    "data.seq_length=64",
    "optim.warmup_steps=40",
    "trainer.progress=false",
    "trainer.log_every=5",
    "launcher.nproc_per_node=2",
]
LARGE = [
    "trainer.micro_batch_size=64",
    "trainer.max_steps=125",
    "optim.warmup_steps=10",
    "optim.lr_scaling=sqrt",
    "optim.base_batch_size=32",
]
DP2 = ["parallel.tensor=1", "trainer.micro_batch_size=16", "trainer.max_steps=500", "optim.lr=3e-4"]
STUDIES: dict[str, dict[str, tuple[int, list[str]]]] = {
    "optimizers": {
        "AdamW, batch 32": (
            32,
            [
                "parallel.tensor=1",
                "trainer.micro_batch_size=16",
                "trainer.max_steps=500",
                "optim.lr=3e-4",
            ],
        ),
        "AdamW, batch 128": (128, [*LARGE, "parallel.tensor=1", "optim.lr=3e-4"]),
        "LAMB, batch 128": (128, [*LARGE, "parallel.tensor=1", "optim.name=lamb", "optim.lr=2e-3"]),
        "LARS, batch 128": (128, [*LARGE, "parallel.tensor=1", "optim.name=lars", "optim.lr=2.0"]),
        "NovoGrad, batch 128": (
            128,
            [
                *LARGE,
                "parallel.tensor=1",
                "optim.name=novograd",
                "optim.lr=1e-2",
                "optim.beta1=0.95",
                "optim.beta2=0.98",
            ],
        ),
    },
    "compression": {
        "none": (32, [*DP2]),
        "bf16": (32, [*DP2, "parallel.grad_compression=bf16"]),
        "powersgd rank 4": (
            32,
            [*DP2, "parallel.grad_compression=powersgd", "parallel.powersgd_rank=4"],
        ),
    },
}


def run_job(overrides: list[str], run_dir: Path) -> list[dict]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [
        sys.executable,
        "-m",
        "tpformer.cli.pretrain",
        *MAIN_JOB,
        *overrides,
        f"hydra.run.dir={run_dir}",
    ]
    result = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if result.returncode:
        raise SystemExit(f"error: {' '.join(cmd)} failed:\n{result.stderr[-3000:]}")
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [x for x in lines if not x.get("eval")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("study", choices=sorted(STUDIES))
    parser.add_argument("--out", type=Path, required=True, help="the PNG to write")
    parser.add_argument("--runs", type=Path, help="where the runs go (default: a temp dir)")
    args = parser.parse_args()
    root = args.runs or Path(tempfile.mkdtemp(prefix=f"tpformer-{args.study}-"))
    curves = {}
    for name, (batch, overrides) in STUDIES[args.study].items():
        records = run_job(overrides, root / name.replace(" ", "_").replace(",", ""))
        curves[name] = [(r["step"] * batch, r["loss"]) for r in records]
        print(f"{name}: done ({len(records)} logged steps)", flush=True)
    first = None
    print("| run | loss at the end (mean of last 5 logs) | vs first |")
    print("|---|---|---|")
    for name, points in curves.items():
        final = sum(loss for _, loss in points[-5:]) / len(points[-5:])
        first = first or final
        print(f"| {name} | {final:.4f} | {final / first:.3f} |")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for name, points in curves.items():
        ax.plot([x for x, _ in points], [y for _, y in points], label=name, linewidth=1.2)
    ax.set_xlabel("training samples")
    ax.set_ylabel("training loss (MLM + NSP)")
    ax.set_title(f"README main job: {args.study}")
    ax.legend()
    ax.grid(alpha=0.3)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
