"""Is my BERT loss normal? Compare a run's metrics.jsonl with a reference curve, with a verdict.

    python tools/compare_loss_curve.py outputs/2026-11-23/10-00-00
    python tools/compare_loss_curve.py RUN_DIR --reference other_run/metrics.jsonl --out cmp.png

The default reference is examples/bert_pretrain/reference_metrics.jsonl: the README's main job
(bert_mini, vocabulary 4000, Shakespeare, seq 64, global batch 32, lr 1e-3 with 100 warmup
steps, 1,200 steps, TP=2 on 2 processes). It prints the loss, MLM loss and accuracy of both runs
at the steps they share, the evaluations, how long the two stayed within 1e-5, and a verdict:
PASS (exit 0) when every shared training loss is within --rtol of the reference's and every
shared evaluation loss within --eval-rtol, else FAIL (exit 1).

The tolerances are the fp32 drift of the same command, not a model of training noise: every
layout computes the same losses, but the rounding of another thread count or layout grows over
hundreds of steps. Measured (2026-11-29): the main job at TP=1 in one process with 2 threads
against the reference stayed within 1e-5 through step 130 (identical at steps 1 and 10), then
drifted to at most 1.5e-3 in the logged training loss and 6.7e-4 in the evaluation loss
(examples/bert_pretrain/rerun_tp1_metrics.jsonl, held by tests/tools/test_compare_loss_curve.py).
The defaults are about 3x those: a run of the same command passes; a run with other settings or
data, or a broken layout, is told apart (a 1% gap fails).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "bert_pretrain"
REFERENCE = EXAMPLE / "reference_metrics.jsonl"
COLUMNS = ("loss", "mlm_loss", "mlm_accuracy", "nsp_accuracy")
TRAIN_RTOL = 5e-3
"""Largest relative gap of a logged training loss to the reference's (drift measured: 1.5e-3)."""
EVAL_RTOL = 2e-3
"""Largest relative gap of an evaluation loss to the reference's (drift measured: 6.7e-4)."""
SAME = 1e-5
"""The gap below which two runs count as computing the same losses (tests/tolerances.py's
FP32_MODEL_REL, what the layout tests hold)."""


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


def gap(run: dict, ref: dict) -> float:
    return abs(run["loss"] - ref["loss"]) / abs(ref["loss"])


def verdict(
    run: dict[int, dict],
    ref: dict[int, dict],
    run_eval: dict[int, dict],
    ref_eval: dict[int, dict],
    rtol: float,
    eval_rtol: float,
) -> tuple[bool, list[str]]:
    """(passed, the lines that say why) over the steps both runs logged."""
    shared = sorted(set(run) & set(ref))
    evals = sorted(set(run_eval) & set(ref_eval))
    gaps = {step: gap(run[step], ref[step]) for step in shared}
    eval_gaps = {step: gap(run_eval[step], ref_eval[step]) for step in evals}
    apart = [step for step in shared if gaps[step] > SAME]
    through = max((s for s in shared if s < apart[0]), default=0) if apart else shared[-1]
    lines = [
        f"within {SAME:.0e} (the same losses) through step {through}"
        + (f"; apart from step {apart[0]}" if apart else "")
    ]
    worst = max(gaps, key=gaps.__getitem__)
    lines.append(
        f"training loss: largest relative gap {gaps[worst]:.1e} at step {worst} "
        f"(tolerance {rtol:.0e}) over {len(shared)} logged steps"
    )
    passed = gaps[worst] <= rtol
    if eval_gaps:
        worst_eval = max(eval_gaps, key=eval_gaps.__getitem__)
        lines.append(
            f"evaluation loss: largest relative gap {eval_gaps[worst_eval]:.1e} at step "
            f"{worst_eval} (tolerance {eval_rtol:.0e}) over {len(evals)} evaluations"
        )
        passed &= eval_gaps[worst_eval] <= eval_rtol
    if passed:
        lines.append("PASS: the run reproduces the reference within the fp32 drift of one command")
    else:
        lines.append(
            "FAIL: the run differs from the reference beyond the fp32 drift of the same command "
            "(other settings, data or seed, or a layout that computes something else)"
        )
    return passed, lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path, help="a run directory or its metrics.jsonl")
    parser.add_argument("--reference", type=Path, default=REFERENCE)
    parser.add_argument("--rtol", type=float, default=TRAIN_RTOL, help="training loss tolerance")
    parser.add_argument("--eval-rtol", type=float, default=EVAL_RTOL, help="eval loss tolerance")
    parser.add_argument(
        "--out", type=Path, help="PNG with both curves (default: <run>/vs_reference.png)"
    )
    parser.add_argument("--no-plot", dest="plot", action="store_false")
    args = parser.parse_args(argv)
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
    passed, lines = verdict(run, ref, run_eval, ref_eval, args.rtol, args.eval_rtol)
    print("\n".join(lines))
    if args.plot:
        out = args.out or (args.run if args.run.is_dir() else args.run.parent) / "vs_reference.png"
        plot(run, ref, out)
        print(f"plot: {out}")
    return 0 if passed else 1


def plot(run: dict[int, dict], ref: dict[int, dict], out: Path) -> None:
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
    fig.tight_layout()
    fig.savefig(out, dpi=100)


if __name__ == "__main__":
    sys.exit(main())
