"""Dry-run the published runs the planner is checked against, at their stated layouts, and
print the planner's memory per rank next to what tpformer's real step holds (train/dry_run.py).

    PYTHONPATH=. python tools/dry_run_published.py [--only 1008B 529.6B-zero-3] [--list]

For each run: Narayanan et al. 2021 Table 1 (1.7B-1T, PTD-P) and Table 2 (ZeRO-3 without model
parallelism), Korthikanti et al. 2022 Table 5 (TP=8, full recomputation or SP + selective), the
first rank of the first and of the last pipeline stage, on the fake backend and the meta
device, under tpformer's own stack on A100-80GB nodes (fused attention, fp32 gradient
buckets, bf16). A micro-batch the paper does not state is 1, a schedule it does not state is
1F1B. Prints a markdown table (GB per rank and TFLOP per step: measured / planner; the bytes
sent per step in every process group against planner/traffic.py, as the largest gap of a group)
and the seconds and the peak host memory of each dry run.
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from dataclasses import replace

from published_runs import (
    KORTHIKANTI_TABLE_5,
    MEGATRON_TABLE_1,
    MEGATRON_TABLE_2,
    PublishedRun,
    gpt,
    stated_layout,
)

from tpformer.config.schema import Config, DataConfig, ParallelConfig, TrainerConfig
from tpformer.parallel.layout import resolve_layout
from tpformer.planner.candidate import Workload, candidate_of
from tpformer.planner.cluster import load_preset, resolve_cluster
from tpformer.planner.memory import predict_stage_memory
from tpformer.planner.traffic import priced, rank_flops, step_traffic
from tpformer.train.dry_run import DryRun, dry_run

GB = 1e9


def runs() -> dict[str, PublishedRun]:
    """Every published run by a short name (params, and the scheme where a model has several)."""
    named: dict[str, PublishedRun] = {}
    for table, rows in (
        ("t1", MEGATRON_TABLE_1),
        ("t2", MEGATRON_TABLE_2),
        ("t5", KORTHIKANTI_TABLE_5),
    ):
        for run in rows:
            named[f"{table}-{run.params_b:g}B-{run.scheme}-{run.gpus}"] = run
    return named


def config_of(run: PublishedRun) -> Config:
    """The run as a tpformer config at its stated layout."""
    layout = stated_layout(
        replace(run, micro_batch=run.micro_batch or 1, schedule=run.schedule or "1f1b")
    )
    base = Config(
        model=gpt(run.layers, run.hidden, run.heads),
        parallel=ParallelConfig(precision="bf16"),  # type: ignore[arg-type]
        data=DataConfig(source="synthetic", seq_length=2048),  # type: ignore[arg-type]
        trainer=TrainerConfig(),
    )
    return layout.apply(base)


def compare(name: str, run: PublishedRun) -> list[str]:
    """Markdown rows: the first and the last stage of the run, measured / predicted."""
    config = config_of(run)
    p = config.parallel
    layout = resolve_layout(p.tensor, p.data, run.gpus, p.pipeline, p.context)  # type: ignore[arg-type]
    gpus_per_node = min(8, run.gpus)
    preset = replace(
        load_preset("a100_node"), gpus_per_node=gpus_per_node, nodes=run.gpus // gpus_per_node,
        calibration="none",
    )  # fmt: skip
    cluster = resolve_cluster(preset, "bf16", cache_dir="/nonexistent")
    work = Workload.of(replace(config, parallel=replace(p, rng="fast")), run.global_batch)
    rows = []
    for stage in sorted({0, layout.pp - 1}):
        rank = layout.rank_of(stage, 0, 0)
        started = time.perf_counter()
        measured: DryRun = dry_run(config, run.gpus, rank)
        seconds = time.perf_counter() - started
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6  # KB -> GB
        (want,) = predict_stage_memory(work, candidate_of(config, layout.dp), cluster, only=[stage])
        cells = [
            f"{m / GB:.2f} / {w / GB:.2f}"
            for m, w in (
                (measured.params, want.params),
                (measured.grads, want.grads),
                (measured.optimizer, want.optimizer),
                (measured.activations, want.activations),
                (measured.buffers, want.buffers),
            )
        ]
        candidate = candidate_of(config, layout.dp)
        traffic = step_traffic(work, candidate, stage)
        gaps = [sent - priced(traffic, k) for k, (_, sent) in measured.collectives.items()]
        sent_gb = sum(sent for _, sent in measured.collectives.values()) / GB
        flops = rank_flops(work, candidate, stage) / 1e12
        rows.append(
            f"| {name} | {stage} | {' | '.join(cells)} | {measured.step_peak / GB:.2f} | "
            f"{measured.flops_per_step / 1e12:,.0f} / {flops:,.0f} | "
            f"{sent_gb:,.1f} in {len(gaps)} groups, {max(gaps, default=0):,.0f} B unpriced | "
            f"{seconds:.0f} | {rss:.2f} |"
        )
        print(rows[-1], flush=True)
    return rows


HEADER = [
    "| run | stage | params | grads | optimizer | activations | buffers | step peak | "
    "TFLOP per step | GB sent per step (planner: equal but for) | seconds | host GB |",
    "|---|---|---|---|---|---|---|---|---|---|---|---|",
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="*", default=None, help="run names (see --list)")
    parser.add_argument("--list", action="store_true", help="print the run names and exit")
    args = parser.parse_args()
    named = runs()
    if args.list:
        print("\n".join(named))
        return
    chosen = args.only or list(named)
    unknown = [n for n in chosen if n not in named]
    if unknown:
        sys.exit(f"error: unknown runs {unknown}; valid: {', '.join(named)}")
    print("GB per rank, dry run / planner (step peak: measured, no prediction)")
    print("\n".join(HEADER), flush=True)
    for name in chosen:
        compare(name, named[name])


if __name__ == "__main__":
    main()
