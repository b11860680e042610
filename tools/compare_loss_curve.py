"""Is my BERT loss normal? Compare a run's metrics.jsonl with a reference curve.

    python tools/compare_loss_curve.py outputs/2026-11-23/10-00-00
    python tools/compare_loss_curve.py RUN_DIR --reference other_run/metrics.jsonl --out cmp.png

The default reference is examples/bert_pretrain/reference_metrics.jsonl: the README's main job
(bert_mini, vocabulary 8000, Shakespeare, seq 64, global batch 32, lr 3e-4 with 40 warmup steps,
500 steps), whose losses are the same at every layout. It prints the loss, MLM loss and MLM
accuracy of both runs at the steps they share, and draws both curves.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

REFERENCE = (
    Path(__file__).resolve().parents[1] / "examples" / "bert_pretrain" / "reference_metrics.jsonl"
)
COLUMNS = ("loss", "mlm_loss", "mlm_accuracy", "nsp_accuracy")


def read(path: Path) -> tuple[dict[int, dict], dict[int, dict]]:
    """(training records, evaluation records) by step."""
    path = path / "metrics.jsonl" if path.is_dir() else path
    if not path.is_file():
        raise SystemExit(f"error: {path} does not exist; pass a run directory or a metrics.jsonl")
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return (
        {r["step"]: r for r in rows if not r.get("eval")},
        {r["step"]: r for r in rows if r.get("eval")},
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path, help="a run directory or its metrics.jsonl")
    parser.add_argument("--reference", type=Path, default=REFERENCE)
    parser.add_argument(
        "--out", type=Path, help="PNG with both curves (default: <run>/vs_reference.png)"
    )
    args = parser.parse_args()
    run, run_eval = read(args.run)
    ref, ref_eval = read(args.reference)
    shared = sorted(set(run) & set(ref))
    if not shared:
        raise SystemExit(
            f"error: no logged step in common (run: {sorted(run)[:5]}..., reference: "
            f"{sorted(ref)[:5]}...); log with the reference's trainer.log_every"
        )
    columns = [c for c in COLUMNS if c in run[shared[0]] and c in ref[shared[0]]]
    print("step  " + "  ".join(f"{c:>22}" for c in columns) + "   (run / reference)")
    for step in shared:
        cells = [f"{run[step][c]:9.4f} / {ref[step][c]:9.4f}" for c in columns]
        print(f"{step:4d}  " + "  ".join(f"{x:>22}" for x in cells))
    for step in sorted(set(run_eval) & set(ref_eval)):
        print(f"eval at {step}: loss {run_eval[step]['loss']:.4f} / {ref_eval[step]['loss']:.4f}")
    last = shared[-1]
    print(
        f"at step {last} the run's loss is "
        f"{run[last]['loss'] / ref[last]['loss']:.3f}x the reference"
    )

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    for name, records in (("run", run), ("reference", ref)):
        steps = sorted(records)
        ax.plot(steps, [records[s]["loss"] for s in steps], label=f"{name} loss")
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.grid(alpha=0.3)
    ax.legend()
    out = args.out or (args.run if args.run.is_dir() else args.run.parent) / "vs_reference.png"
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    print(f"plot: {out}")


if __name__ == "__main__":
    main()
