"""Step time of parallel.rng=exact vs fast and of trainer.compile vs eager, on this machine.

    python tools/benchmark_fast_path.py                     # bert_small, seq 128, batch 8, fp32
    python tools/benchmark_fast_path.py --model bert_base --device cuda --precision bf16

One process (TP=1), dropout 0.1, the same synthetic batches for every variant (tools/gpu_check.py
makes them), AdamW; compile time is excluded (warm-up steps) and dynamo's cache is reset before
each variant. Prints ms per step, the ratio to exact eager measured in the same run and, under
fast, compiled over eager.
"""

from __future__ import annotations

import argparse

import torch
from gpu_check import measure, model_config, synthetic_batches, tpformer_step

VARIANTS = [("exact", False), ("fast", False), ("exact", True), ("fast", True)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="bert_small")
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--precision", default="fp32")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    config = model_config(args.model, args.seq, tiny=False)
    batches = synthetic_batches(config, args.batch, args.seq, args.steps, device)
    print(
        f"{args.model}, seq {args.seq}, batch {args.batch}, {args.precision}, {device}, "
        f"{args.threads} threads; {args.steps} timed steps after {args.warmup}"
    )
    times = {}
    for rng, compiled in VARIANTS:
        torch._dynamo.reset()  # each compiled variant from a clean cache (no earlier graphs)
        step = tpformer_step(
            config, device, args.precision, compiled=compiled, recompute="none", rng=rng
        )
        times[rng, compiled] = measure(step, batches, device, args.warmup)[0]
    base = times["exact", False]
    for (rng, compiled), seconds in times.items():
        label = f"rng {rng}, {'compiled' if compiled else 'eager'}"
        print(f"  {label:<22} {seconds * 1e3:8.1f} ms/step   {seconds / base:5.2f}x exact eager")
    ratio = times["fast", True] / times["fast", False]
    print(f"  under fast: compiled / eager = {ratio:.2f} (a block is one graph there)")


if __name__ == "__main__":
    main()
