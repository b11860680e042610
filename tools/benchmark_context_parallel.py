"""Context parallelism: saved activations and ring traffic per rank against the formulas, and
the step time, at CP = 1, 2, 4 in one run.

    python tools/benchmark_context_parallel.py                      # GPT, seq 4096, CP 1 2 4
    python tools/benchmark_context_parallel.py --seq 2048 --cp 1 2 --rounds 2

For each CP degree the tool starts that many gloo processes (1 thread each), builds a small
GPT (the width is irrelevant to what is measured: the [s, s] attention terms dominate at long
sequences) with dropout 0.1 in exact mode, and measures over one forward + backward of the
causal-LM loss, with saved-tensor hooks (parameters excluded, each storage once), what every
transformer layer keeps for backward, and with the collective counters the bytes each rank
sends. Formulas: tpformer.planner.memory.layer_activation_bytes (context=cp) and
tpformer.planner.step_time.ring_bytes_per_layer: (2 (cp - 1) + cp) blocks of stacked keys and
values (2 b (a/t) (s/cp) d elements) per layer: cp - 1 forward, as many again in backward plus
cp gradient blocks (fp32). The step time (forward +
backward, median of the rounds) is measured in the same processes.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from tpformer.config.presets import preset
from tpformer.config.schema import ModelConfig
from tpformer.engine.memory import measure_saved_activations
from tpformer.models import build_model
from tpformer.parallel.comm import count_collectives
from tpformer.parallel.context import ParallelContext
from tpformer.planner.layer_memory import layer_activation_bytes
from tpformer.planner.step_time import ring_bytes_per_layer


def _model_config(args: argparse.Namespace) -> ModelConfig:
    return preset(
        "gpt2_small",
        vocab_size=256,
        hidden_size=args.hidden,
        num_heads=args.heads,
        num_layers=args.layers,
        intermediate_size=4 * args.hidden,
        max_position_embeddings=args.seq,
        dropout=0.1,
        attention_dropout=0.1,
    )


def _worker(rank: int, cp: int, store: str, args: argparse.Namespace, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"file://{store}",
        rank=rank,
        world_size=cp,
        timeout=timedelta(seconds=600),
    )
    ctx = ParallelContext.create(context=cp, device=torch.device("cpu"), rng="exact")
    config = _model_config(args)
    model = build_model(config, ctx, task="causal_lm").train()
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, config.vocab_size, (args.batch, args.seq), generator=g)

    def forward() -> torch.Tensor:
        ctx.rng.set_position(step=1, sample_offset=0)
        return model(ids, labels=ids).loss

    with count_collectives() as counts:
        saved = measure_saved_activations(model, forward)
    times = []
    for _ in range(args.rounds):
        dist.barrier()
        start = time.perf_counter()
        forward().backward()
        times.append(time.perf_counter() - start)
    if rank == 0:
        result = {
            "per_layer": saved.per_layer,
            "sent": counts.bytes["send"] / config.num_layers,
            "step": statistics.median(times),
        }
        with open(out, "w") as f:
            json.dump(result, f)
    ctx.destroy()


def _measure(cp: int, args: argparse.Namespace) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "result.json")
        mp.spawn(_worker, args=(cp, os.path.join(tmp, "store"), args, out), nprocs=cp)
        with open(out) as f:
            return json.load(f)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seq", type=int, default=4096)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--cp", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    config = _model_config(args)
    s, b, h, a = args.seq, args.batch, args.hidden, args.heads
    print(
        f"GPT hidden {h}, {a} heads, seq {s}, batch {b}, fp32, dropout 0.1 (parallel.rng=exact), "
        f"gloo on CPU, 1 thread per rank"
    )
    print(
        "| CP | saved per layer per rank (MB) | formula (MB) | vs CP=1 | sent per layer per rank "
        "(MB) | ring formula (MB) | step (s) |"
    )
    print("|---|---|---|---|---|---|---|")
    base = None
    for cp in args.cp:
        got = _measure(cp, args)
        measured = max(got["per_layer"])
        formula = layer_activation_bytes(
            s,
            b,
            h,
            a,
            config.intermediate_size,
            tp=1,
            sequence_parallel=False,
            recompute="none",
            itemsize=4,
            mask_bytes=4,
            context=cp,
            attention_dropout=True,
        )
        ring = ring_bytes_per_layer(b, a, s, h, tp=1, cp=cp, itemsize=4)
        base = base or measured
        print(
            f"| {cp} | {measured / 1e6:.1f} | {formula / 1e6:.1f} | {measured / base:.3f} | "
            f"{got['sent'] / 1e6:.2f} | {ring / 1e6:.2f} | {got['step']:.2f} |"
        )


if __name__ == "__main__":
    main()
