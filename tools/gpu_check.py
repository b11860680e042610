"""GPU acceptance run, right on its first try: throughput, MFU and peak memory of BERT
pretraining steps on one device next to Hugging Face measured in the same run, a precision
check against fp32 with thresholds, and with several devices the multi-GPU leg (gpu_check_leg.py).

    PYTHONPATH=. python tools/gpu_check.py --budget-s 600      # what fits in 10 minutes
    PYTHONPATH=. python tools/gpu_check.py --device cpu --tiny # the same code on a tiny model
    PYTHONPATH=. python tools/gpu_check.py --device cpu --tiny --world 2   # + the layout leg

Needs only torch and transformers (no Hydra, no datasets). Every contender runs in a process
of its own (nothing of an earlier contender's model, optimizer state or compiled graphs
survives into the next, and its peak memory is its own), in the order of the quick look first:
bert_base seq 128 tpformer compiled and Hugging Face, then the other variants and shapes.
tpformer runs at TP=1 with parallel.rng=fast, bf16 compute with fp32 master weights and fused
AdamW, eager and torch.compile'd, with no, selective and full recomputation, and compiled with
parallel.precision=fp8 where fp8 matmuls run (its MFU over the same bf16 peak); Hugging Face
`BertForPreTraining` runs with attn_implementation="sdpa", bf16 autocast and fused AdamW.

Headline: tokens/s. MFU credits both sides with the same FLOPs, the work the task needs
(`tpformer.models.costs.step_flops`: the MLM head on the labeled rows), over the device's dense
bf16 peak (`tpformer.device_peaks`, by SKU; --peak-tflops to override). Each row (a contender,
a precision's gap, a layout of the leg) is printed and appended to --out (JSON lines) as it
finishes, so a run cut off by its time slot keeps every
finished row. Memory in GiB (2^30 bytes). Exit 1 when the precision check exceeds its thresholds
or a layout of the multi-GPU leg differs from the one-device run.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tools.gpu_check_steps import (
    BATCH_KINDS,
    DEFAULT_KINDS,
    measure_contender,
    precision_gaps,
)

VARIANTS = [  # (label, torch.compile, recompute, parallel.precision), the quick look's first
    ("tpformer compiled", True, "none", "bf16"),
    ("tpformer eager", False, "none", "bf16"),
    ("tpformer fp8 compiled", True, "none", "fp8"),
    ("tpformer compiled + selective", True, "selective", "bf16"),
    ("tpformer compiled + full", True, "full", "bf16"),
]
"""fp8 (the blocks' linears through torch._scaled_mm) runs where fp8 matmuls do: GPUs of compute
capability 8.9 or newer, and the CPU."""
HF_LABEL = "HF BertForPreTraining sdpa"
HF_COMPILED_LABEL = "HF BertForPreTraining sdpa compiled"
"""Hugging Face under `torch.compile(model)`, as Trainer's `torch_compile=True` runs it."""
TOKENS_PER_STEP = 32768
"""Tokens per step on a GPU: micro-batch 256 at seq 128, 64 at seq 512."""
PRECISION_LIMITS = {"bf16": 2e-2, "fp16": 5e-3, "fp8": 5e-2}
"""Largest relative loss gap to fp32 over the precision check's steps (dropout 0, the same
batches): set by hand from the bf16/fp16 rounding of bert_small's losses before a GPU ran it.
Measured on an H100 (2026-11-27, 50 steps): bf16 2.1e-3, fp16 6.2e-4; the CPU's bf16 gap over
the tiny check is about 2e-4. fp8's limit is set by hand, 2.5x bf16's, before any GPU ran it
(its 200-step gap to bf16 on a CPU: tests/engine/test_fp8.py)."""
FIRST_GUESS_S = {"cuda": 90.0, "cpu": 20.0}
"""Wall time assumed for a contender before one was measured (process start, compile, steps)."""


@dataclass
class Contender:
    model: str
    seq: int
    batch: int
    kind: str
    """The batch kind (gpu_check_steps.BATCH_KINDS): padded, unpadded or packed."""
    label: str
    compiled: bool
    recompute: str
    precision: str
    hf: bool
    steps: int
    warmup: int
    device: str
    tiny: bool
    peak_tflops: float


def fp8_matmuls(device: str) -> bool:
    """Whether `device` runs torch._scaled_mm: the CPU, or a GPU of compute capability 8.9+."""
    dev = torch.device(device)
    return dev.type == "cpu" or torch.cuda.get_device_capability(dev) >= (8, 9)


def contenders(args: argparse.Namespace) -> list[Contender]:
    """Every contender, the quick look first (the first shape's compiled tpformer and HF)."""
    out = []
    shapes = [(n, s, k) for n in args.models for s in args.seqs for k in args.batch_kinds]
    for name, seq, kind in shapes:
        batch = max(1, args.tokens // seq)
        common = {"model": name, "seq": seq, "batch": batch, "kind": kind,
                  "steps": args.steps, "warmup": args.warmup, "device": args.device,
                  "tiny": args.tiny, "peak_tflops": args.peak_tflops}  # fmt: skip
        shape = [
            Contender(label=label, compiled=c, recompute=r, precision=p, hf=False, **common)
            for label, c, r, p in VARIANTS
            if (args.compile or not c) and (p != "fp8" or args.fp8)
        ]
        hf = [
            Contender(
                label=label, compiled=c, recompute="none", precision="bf16", hf=True, **common
            )
            for label, c in [(HF_LABEL, False), (HF_COMPILED_LABEL, True)]
            if args.compile or not c
        ]
        chosen = [shape[0], hf[0], *shape[1:], *hf[1:]]
        out += [c for c in chosen if not args.only or c.label in args.only]
    return out


def run_child(mode: str, spec: dict, timeout_s: float) -> dict | None:
    """Run this script as `--<mode> SPEC` in a process of its own; its JSON result, or None
    when it failed or ran out of time (its stderr tail is shown)."""
    command = [sys.executable, __file__, f"--{mode}", json.dumps(spec)]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        print(f"  {spec.get('label', mode)}: over {timeout_s:.0f} s, stopped", flush=True)
        return None
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode or not lines:
        print(f"  {spec.get('label', mode)} failed:\n{done.stderr[-2000:]}", flush=True)
        return None
    return dict(json.loads(lines[-1].removeprefix("RESULT ")))


def print_row(row: dict, hf: dict | None) -> None:
    mfu = "-" if math.isnan(row["mfu"]) else f"{row['mfu']:.1%}"
    peak = "-" if math.isnan(row["peak_gib"]) else f"{row['peak_gib']:.2f}"
    ratio = f"{row['tokens_per_s'] / hf['tokens_per_s']:.2f}" if hf else "-"
    print(
        f"{row['model']:<11}{row['seq']:>5}{row['batch']:>6} {row['kind']:<9}{row['label']:<36}"
        f"{row['tokens_per_s']:>11.0f}{row['step_s'] * 1e3:>9.1f}{row['tflops']:>9.2f}"
        f"{mfu:>7}{peak:>9}{ratio:>7}",
        flush=True,
    )


def throughput(args: argparse.Namespace, started: float) -> list[dict]:
    print(
        f"\n{'model':<11}{'seq':>5}{'batch':>6} {'kind':<9}{'contender':<36}{'tokens/s':>11}"
        f"{'step ms':>9}{'TFLOP/s':>9}{'MFU':>7}{'peak GiB':>9}{'vs HF':>7}"
    )
    rows: list[dict] = []
    estimate = FIRST_GUESS_S[torch.device(args.device).type]
    for contender in contenders(args):
        left = args.budget_s - (time.perf_counter() - started)
        if left < estimate:
            c = contender
            print(f"  {c.model} {c.seq} {c.kind} {c.label}: skipped (budget)")
            continue
        start = time.perf_counter()
        row = run_child("contender", asdict(contender), timeout_s=left)
        estimate = max(estimate, time.perf_counter() - start)
        if row is None:
            continue
        rows.append(row)
        with open(args.out, "a") as out:
            out.write(json.dumps(row) + "\n")
        same = [
            r
            for r in rows
            if (r["model"], r["seq"], r["kind"], r["label"])
            == (row["model"], row["seq"], row["kind"], HF_LABEL)
        ]
        print_row(row, same[0] if same and not row["hf"] else None)
    print_ratios(rows)
    return rows


def print_ratios(rows: list[dict]) -> None:
    """tokens/s of each tpformer row over each Hugging Face row of its shape, once all ran (a
    row printed before its reference shows no ratio)."""
    references = [r for r in rows if r["hf"]]
    if not references:
        return
    print("\ntokens/s against Hugging Face, same shape:")
    for row in (r for r in rows if not r["hf"]):
        ratios = [
            f"{row['tokens_per_s'] / ref['tokens_per_s']:.2f}x {ref['label']}"
            for ref in references
            if (ref["model"], ref["seq"], ref["kind"]) == (row["model"], row["seq"], row["kind"])
        ]
        if ratios:
            shape = f"{row['model']} {row['seq']} {row['kind']}"
            print(f"  {shape} {row['label']}: {', '.join(ratios)}")


def precision_check(args: argparse.Namespace) -> bool:
    spec = {"device": args.device, "tiny": args.tiny, "steps": args.loss_steps, "fp8": args.fp8}
    result = run_child("precision", spec, timeout_s=600)
    if result is None:
        return False
    print(f"\nprecision check ({args.loss_steps} steps, dropout 0, the same batches):")
    ok = True
    for precision, gap in result["gaps"].items():
        limit = PRECISION_LIMITS.get(precision)
        passed = limit is None or gap <= limit
        ok &= passed
        verdict = "" if limit is None else f" (limit {limit:.0e}: {'pass' if passed else 'FAIL'})"
        print(f"  {precision}: largest relative loss gap to fp32 {gap:.2e}{verdict}")
        row = {"precision": precision, "steps": args.loss_steps, "gap": gap, "limit": limit}
        with open(args.out, "a") as out:
            out.write(json.dumps({**row, "passed": passed}) + "\n")
    return ok


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--tiny", action="store_true", help="bert_tiny, seq 32, a few steps")
    parser.add_argument("--models", nargs="+", default=None)
    parser.add_argument("--seqs", nargs="+", type=int, default=None)
    parser.add_argument(
        "--batch-kinds",
        nargs="+",
        choices=BATCH_KINDS,
        default=None,
        help="padded (an attention mask), unpadded (none) and/or packed (documents' mask): "
        "each kernel path is timed (default: padded and unpadded)",
    )
    parser.add_argument("--tokens", type=int, default=None, help="tokens per step")
    parser.add_argument("--steps", type=int, default=None, help="timed steps per contender")
    parser.add_argument("--warmup", type=int, default=None)
    parser.add_argument("--loss-steps", type=int, default=None)
    parser.add_argument("--no-compile", dest="compile", action="store_false")
    parser.add_argument(
        "--no-fp8", dest="fp8", action="store_false", help="no fp8 contender or precision row"
    )
    parser.add_argument("--only", nargs="+", default=None, help="contender labels to run")
    parser.add_argument("--peak-tflops", type=float, default=0.0)
    parser.add_argument("--budget-s", type=float, default=3600.0, help="wall time to fit in")
    parser.add_argument("--out", default="gpu_check.jsonl", help="JSON lines, appended")
    parser.add_argument("--world", type=int, default=0, help="multi-GPU leg ranks (0: GPUs)")
    parser.add_argument("--leg-rngs", default="exact,fast", help="the leg's parallel.rng runs")
    parser.add_argument("--contender", help=argparse.SUPPRESS)
    parser.add_argument("--precision", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.fp8 = args.fp8 and fp8_matmuls(args.device)
    tiny = args.tiny
    args.models = args.models or (["bert_tiny"] if tiny else ["bert_base", "bert_large"])
    args.seqs = args.seqs or ([32] if tiny else [128, 512])
    args.batch_kinds = args.batch_kinds or (["padded"] if tiny else list(DEFAULT_KINDS))
    args.tokens = args.tokens or (128 if tiny else TOKENS_PER_STEP)
    args.steps = args.steps or (2 if tiny else 20)
    args.warmup = args.warmup if args.warmup is not None else (1 if tiny else 5)
    args.loss_steps = args.loss_steps or (5 if tiny else 50)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.contender:  # a child: one contender, one JSON line
        row = measure_contender(Contender(**json.loads(args.contender)))
        print("RESULT " + json.dumps(row), flush=True)
        return 0
    if args.precision:
        print("RESULT " + json.dumps({"gaps": precision_gaps(**json.loads(args.precision))}))
        return 0
    started = time.perf_counter()
    device = torch.device(args.device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"device: {name}; torch {torch.__version__}; rows -> {args.out}", flush=True)
    throughput(args, started)
    ok = precision_check(args)
    world = args.world or (torch.cuda.device_count() if device.type == "cuda" else 0)
    if world > 1:
        from tools.gpu_check_leg import layout_leg

        ok &= layout_leg(args, world, started)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
