"""Predicted vs measured step time of the layouts tpformer-plan ranks, on this CPU machine.

For each model (bert_small, bert_base) and world size (2 and 4 gloo processes, one thread
each), the planner ranks every layout of a global batch of 16 x seq 128 on the `cpu` cluster
(4 processes share the 2 cores: each rank is then half a core, so the tool halves the
per-device compute, memory and link bandwidths, since gloo's collectives copy and add on the
CPU, and the memory of a device). A spread of the ranked layouts (the top ones, the
best of each tensor x pipeline degree, and evenly spaced others) is run for real: one warm-up
step and `--steps` timed ones (median), on fresh processes per layout. Printed: per layout
predicted and measured seconds, the Spearman rank correlation of the two orders, and where the
planner's first choice lands among the measured.

    python tools/benchmark_plan.py                       # ~15 minutes on 2 cores
    python tools/benchmark_plan.py --models bert_small --worlds 2 --layouts 6

Run `tpformer-plan --calibrate cluster=cpu` first to plan with this machine's constants (the
tool says which it used).
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import statistics
import tempfile
import time
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from tpformer.config.presets import preset
from tpformer.config.schema import Config, DataConfig, OptimConfig, TrainerConfig
from tpformer.parallel.context import ParallelContext
from tpformer.planner.candidate import Candidate, Workload
from tpformer.planner.cluster import Cluster, load_preset, resolve_cluster
from tpformer.planner.search import Evaluated, best_per_family, search
from tpformer.train.pretraining import pretraining_trainer

SEQ, GLOBAL_BATCH = 128, 16


def base_config(model: str) -> Config:
    return Config(
        model=preset(model),
        optim=OptimConfig(lr=1e-4, warmup_steps=1),
        data=DataConfig(source="synthetic", seq_length=SEQ),
        trainer=TrainerConfig(max_steps=100, log_every=1, eval_steps=1, progress=False),
    )


def cluster_for(world: int, cache_dir: str) -> Cluster:
    """The cpu preset (and its stored calibration); above 2 ranks, each rank is a share of a
    core: compute and bandwidth per device divided by world / 2."""
    cluster = resolve_cluster(
        replace(load_preset("cpu"), gpus_per_node=world), "fp32", cache_dir=cache_dir
    )
    share = max(1.0, world / 2)
    slow = lambda link: replace(link, bandwidth=link.bandwidth / share)  # noqa: E731
    return replace(
        cluster,
        peak_flops=cluster.peak_flops / share,
        device_memory=0.7 * cluster.device_memory / share,  # headroom: 2 at a time
        memory_bandwidth=cluster.memory_bandwidth / share,
        layer_overhead=cluster.layer_overhead * share,
        intra=slow(cluster.intra),
        inter=slow(cluster.inter),
    )


def chosen(ranked: list[Evaluated], families: list[Evaluated], count: int) -> list[Evaluated]:
    """The top 3, the best of each family, then evenly spaced others, up to `count`."""
    picks: list[Evaluated] = []
    for e in [*ranked[:3], *families]:
        if e.fits and e not in picks:
            picks.append(e)
    step = max(1, len(ranked) // max(1, count - len(picks)))
    for e in ranked[::step]:
        if len(picks) >= count:
            break
        if e not in picks:
            picks.append(e)
    return picks


def _worker(
    rank: int, world: int, store: str, model: str, layouts: list[Candidate], steps: int, out: str
) -> None:
    torch.set_num_threads(1)
    logging.disable(logging.WARNING)
    dist.init_process_group(
        "gloo",
        init_method=f"file://{store}",
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=1800),
    )
    times = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, c in enumerate(layouts):
            ctx = ParallelContext.create(
                c.tp,
                c.dp,
                pipeline=c.pp,
                device=torch.device("cpu"),
                sequence_parallel=c.sequence_parallel,
            )
            trainer = pretraining_trainer(c.apply(base_config(model)), ctx, Path(tmp) / str(i))
            samples = []
            for step in range(steps + 1):
                dist.barrier()
                start = time.perf_counter()
                trainer.run_step(step, trainer.task.train_batches, train=True)
                trainer.engine.step()
                dist.barrier()
                samples.append(time.perf_counter() - start)
            times.append(statistics.median(samples[1:]))
            del trainer, ctx
            gc.collect()
    if rank == 0:
        Path(out).write_text(json.dumps(times))
    dist.destroy_process_group()


def measure(model: str, world: int, layouts: list[Candidate], steps: int) -> list[float]:
    """Each layout on fresh processes (a finished trainer's memory is not all given back)."""
    times = []
    for layout in layouts:
        with tempfile.TemporaryDirectory() as tmp:
            mp.start_processes(
                _worker,
                args=(world, f"{tmp}/store", model, [layout], steps, f"{tmp}/out.json"),
                nprocs=world,
                start_method="spawn",
            )
            times += json.loads(Path(f"{tmp}/out.json").read_text())
    return times


def spearman(a: list[float], b: list[float]) -> float:
    def ranks(x: list[float]) -> list[float]:
        order = sorted(range(len(x)), key=lambda i: x[i])
        r = [0.0] * len(x)
        for position, i in enumerate(order):
            r[i] = float(position)
        return r

    ra, rb = ranks(a), ranks(b)
    n = len(a)
    return 1 - 6 * sum((x - y) ** 2 for x, y in zip(ra, rb)) / (n * (n * n - 1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", default=["bert_small", "bert_base"])
    parser.add_argument("--worlds", nargs="+", type=int, default=[2, 4])
    parser.add_argument("--layouts", type=int, default=10, help="layouts run per model x world")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--cache-dir", default="~/.cache/tpformer")
    parser.add_argument("--json", help="also write the rows here")
    args = parser.parse_args()
    rows = []
    for model in args.models:
        for world in args.worlds:
            cluster = cluster_for(world, args.cache_dir)
            work = Workload.of(base_config(model), GLOBAL_BATCH)
            result = search(work, cluster, device_type="cpu")
            picks = chosen(result.ranked, list(best_per_family(result).values()), args.layouts)
            measured = measure(model, world, [e.candidate for e in picks], args.steps)
            predicted = [e.time.step for e in picks]  # type: ignore[union-attr]
            fastest = min(measured)
            first = measured[0]  # picks[0] is the planner's first choice
            print(
                f"\n## {model}, {world} processes (cluster cpu"
                f"{', calibrated' if cluster.calibrated else ', preset constants'}), "
                f"{len(result.ranked)} layouts fit; {len(picks)} run"
            )
            print("| planner rank | layout | predicted s | measured s | measured / predicted |")
            print("|---|---|---|---|---|")
            for e, p, m in zip(picks, predicted, measured):
                print(
                    f"| {result.ranked.index(e) + 1} | {e.candidate.label()} | {p:.3f} | "
                    f"{m:.3f} | {m / p:.2f} |"
                )
            rho = spearman(predicted, measured)
            print(
                f"Spearman rank correlation {rho:.2f}; planner's first choice measured "
                f"{first:.3f} s = {first / fastest:.3f}x the measured fastest "
                f"({picks[measured.index(fastest)].candidate.label()})"
            )
            rows.append(
                {
                    "model": model,
                    "world": world,
                    "spearman": rho,
                    "first_vs_fastest": first / fastest,
                    "layouts": [
                        {"layout": e.candidate.label(), "predicted": p, "measured": m}
                        for e, p, m in zip(picks, predicted, measured)
                    ],
                }
            )
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
