"""Bytes sent and step time of compressed DP gradient reduction against uncompressed, in one run.

    python tools/benchmark_compression.py      # bert_small and bert_base, DP 2 and 4
    python tools/benchmark_compression.py --models bert_small --dp 2 --steps 5

For each model and DP degree the tool starts that many gloo processes (1 thread each, tensor=1,
ZeRO stage 0) and runs pretraining steps (forward, backward, optimizer step) with
parallel.grad_compression none, bf16 and powersgd (compressing from the first step). Bytes are
those each rank sends per step by the ring model, counted by tpformer.parallel.comm (gradient
reduction plus the few scalars of the norm); step time is the median over the measured steps
after one warm-up step. Each option runs in its own set of processes, one after another (so
the memory of one bert_base engine per rank suffices).
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
from tpformer.config.schema import OptimConfig, ParallelConfig
from tpformer.engine.parallelize import parallelize
from tpformer.models import build_model
from tpformer.parallel.comm import count_collectives
from tpformer.parallel.context import ParallelContext

OPTIONS = ("none", "bf16", "powersgd")


def _worker(
    rank: int,
    world: int,
    store: str,
    args: argparse.Namespace,
    model_name: str,
    option: str,
    out: str,
) -> None:
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"file://{store}",
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=1800),
    )
    ctx = ParallelContext.create(tensor=1, device=torch.device("cpu"))
    config = preset(model_name, vocab_size=30522)
    g = torch.Generator().manual_seed(rank)
    ids = torch.randint(5, config.vocab_size, (args.batch, args.seq), generator=g)
    labels = torch.where(torch.rand(ids.shape, generator=g) < 0.15, ids, -100)
    model = build_model(config, ctx, task="pretraining").train()
    parallel = ParallelConfig(
        grad_compression=option, powersgd_rank=args.powersgd_rank, powersgd_start_step=0
    )
    engine = parallelize(model, parallel, OptimConfig(lr=1e-4), ctx).engine
    times, sent = [], []
    for step in range(args.steps + 1):
        ctx.rng.set_position(step, rank * args.batch)
        dist.barrier()
        start = time.perf_counter()
        with count_collectives() as counts:
            engine.backward(model(ids, mlm_labels=labels).loss / ctx.dp.size)
            engine.step()
        dist.barrier()
        if step:  # the first step warms up
            times.append(time.perf_counter() - start)
            sent.append(sum(counts.bytes.values()))
    results = {"time": statistics.median(times), "bytes": statistics.median(sent)}
    if rank == 0:
        with open(out, "w") as f:
            json.dump(results, f)
    ctx.destroy()


def _run(model_name: str, dp: int, option: str, args: argparse.Namespace) -> dict:
    workdir = tempfile.mkdtemp(prefix="tpformer-compression-")
    out = os.path.join(workdir, "result.json")
    mp.spawn(
        _worker, args=(dp, os.path.join(workdir, "store"), args, model_name, option, out), nprocs=dp
    )
    with open(out) as f:
        return json.load(f)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["bert_small", "bert_base"])
    parser.add_argument("--dp", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--batch", type=int, default=2, help="sequences per DP rank")
    parser.add_argument("--powersgd-rank", type=int, default=4)
    args = parser.parse_args()
    mb = 2**20
    print(
        f"seq {args.seq}, {args.batch} sequences per rank, fp32, ZeRO stage 0, gloo processes x "
        f"1 thread, PowerSGD rank {args.powersgd_rank}; medians of {args.steps} steps"
    )
    print(
        "| model | DP | compression | sent per step per rank (MB) | vs none | step (s) | vs none |"
    )
    print("|---|---|---|---|---|---|---|")
    for model_name in args.models:
        for dp in args.dp:
            result = {option: _run(model_name, dp, option, args) for option in OPTIONS}
            base = result["none"]
            for option in OPTIONS:
                r = result[option]
                print(
                    f"| {model_name} | {dp} | {option} | {r['bytes'] / mb:.1f} | "
                    f"{r['bytes'] / base['bytes']:.3f} | {r['time']:.2f} | "
                    f"{r['time'] / base['time']:.2f} |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
