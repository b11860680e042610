"""Activation memory and step-time overhead of each activation-checkpointing mode.

    python tools/benchmark_recompute.py                        # bert_base layers, seq 512
    python tools/benchmark_recompute.py --model bert_small --seq 512 --batch 2

Saved activation bytes are measured with saved-tensor hooks over one forward (the tensors
autograd keeps for backward, each storage once); step time is forward+backward, the modes
interleaved round by round, median reported, overhead against "none" measured in the same run.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from tpformer.config.presets import preset
from tpformer.config.schema import ParallelConfig
from tpformer.engine.memory import measure_saved_activations
from tpformer.engine.recompute import apply_recompute
from tpformer.models import build_model
from tpformer.parallel.context import ParallelContext

MODES = ("none", "selective", "full")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="bert_base")
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    config = preset(args.model, vocab_size=30522)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, config.vocab_size, (args.batch, args.seq), generator=g)
    labels = torch.where(torch.rand(ids.shape, generator=g) < 0.15, ids, -100)
    models = {}
    for mode in MODES:
        ctx = ParallelContext.single(device="cpu")
        model = build_model(config, ctx, task="pretraining").train()
        apply_recompute(model, ParallelConfig(recompute=mode), ctx.rng)
        models[mode] = model

    def step(mode: str) -> torch.Tensor:
        return models[mode](ids, mlm_labels=labels).loss

    saved = {m: measure_saved_activations(models[m], lambda m=m: step(m)) for m in MODES}
    times: dict[str, list[float]] = {m: [] for m in MODES}
    for _ in range(args.rounds):
        for mode in MODES:
            start = time.perf_counter()
            step(mode).backward()
            times[mode].append(time.perf_counter() - start)
            models[mode].zero_grad(set_to_none=True)

    base_mem, base_t = saved["none"].total, statistics.median(times["none"])
    print(
        f"{args.model} ({config.num_layers} layers, hidden {config.hidden_size}, "
        f"{config.num_heads} heads), seq {args.seq}, batch {args.batch}, fp32, dropout "
        f"{config.dropout}, {args.threads} threads, {args.rounds} interleaved rounds"
    )
    print("| mode | saved activations (MB) | vs none | fwd+bwd (s) | time vs none |")
    print("|---|---|---|---|---|")
    for mode in MODES:
        mem, t = saved[mode].total, statistics.median(times[mode])
        print(f"| {mode} | {mem / 2**20:.1f} | {mem / base_mem:.2f} | {t:.2f} | {t / base_t:.2f} |")


if __name__ == "__main__":
    main()
