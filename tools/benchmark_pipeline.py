"""Pipeline parallelism measured against its theory, in one run: (a) the bubble, (b) activation
memory per stage for GPipe vs 1F1B, (c) the partitioner on a model with a heavy output head.

    python tools/benchmark_pipeline.py                       # bert_mini, seq 128, micro-batch 2
    python tools/benchmark_pipeline.py --pipelines 2 --micros 1 2 4 8 --steps 3

Each pipeline size P runs as P gloo processes (1 thread each) through the real training step
(`Trainer.run_step` + `engine.step`, synthetic data, dropout 0.1). For every schedule and m
micro-batches per step the tool reports the median step time and the stage work measured inside
the same steps: the seconds each stage spends in forward, head and backward compute (not in
receives). (a) measured slowdown = step time / (m x the busiest stage's work per micro-batch),
next to the ideal (m + p - 1) / m (interleaved: 1 + (p - 1) / (v m)) and the schedule simulated
with the measured per-stage times. (b) the saved activations alive on each stage (saved-tensor
hooks per forward, parameters excluded, released at the micro-batch's backward in order), peak
per step, next to the theory (GPipe m micro-batches, 1F1B p - r). (c) step time of an equal
layer split, `balanced` (FLOPs) and `profile` (timed) for the 30522-row MLM head.
NOTE: with P processes on fewer cores (P=4 on this 2-core machine) stages share cores; idle
stages do not compete, so the bubble still shows, but the times are those of shared cores.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections import deque
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from tpformer.config.presets import preset
from tpformer.config.schema import (
    Config,
    DataConfig,
    OptimConfig,
    ParallelConfig,
    PipelineSplit,
    TrainerConfig,
)
from tpformer.parallel.context import ParallelContext
from tpformer.parallel.pipeline.simulate import simulate
from tpformer.train.pretraining import pretraining_trainer


def _config(
    args: argparse.Namespace,
    world: int,
    schedule: str,
    micro_batches: int,
    split: str | list[int] = "balanced",
) -> Config:
    model = preset(
        args.model,
        vocab_size=args.vocab,
        dropout=0.1,
        attention_dropout=0.1,
        max_position_embeddings=max(512, args.seq),
    )
    mode = PipelineSplit(split) if isinstance(split, str) else PipelineSplit.balanced
    return Config(
        model=model,
        parallel=ParallelConfig(
            pipeline=world,
            pipeline_schedule=schedule,
            pipeline_split=mode,
            pipeline_layers=[] if isinstance(split, str) else split,
        ),
        optim=OptimConfig(lr=1e-4, warmup_steps=1),
        data=DataConfig(source="synthetic", seq_length=args.seq),
        trainer=TrainerConfig(
            max_steps=args.steps + 1,
            micro_batch_size=args.micro,
            grad_accum=micro_batches,
            log_every=1,
            eval_steps=1,
            progress=False,
        ),
    )


class StageMeter:
    """Compute seconds and live saved activations of this stage, by wrapping its parts."""

    def __init__(self, trainer: object) -> None:
        runner, engine = trainer.task.pipeline, trainer.engine  # type: ignore[attr-defined]
        self.busy, self.live, self.peak = 0.0, 0, 0
        self.alive: deque[int] = deque()
        params = {p.untyped_storage().data_ptr() for p in trainer.model.parameters()}  # type: ignore[attr-defined]
        stage = runner.stage
        forward, head, backward = stage.forward, stage.head, engine.backward
        meter = self

        def saving(fn, new_entry: bool):
            def run(*a, **k):
                seen: set[int] = set()
                saved = 0

                def pack(t: torch.Tensor) -> torch.Tensor:
                    nonlocal saved
                    ptr = t.untyped_storage().data_ptr()
                    if ptr not in seen and ptr not in params:
                        seen.add(ptr)
                        saved += t.untyped_storage().nbytes()
                    return t

                start = time.perf_counter()
                if torch.is_grad_enabled():
                    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                        out = fn(*a, **k)
                    if new_entry:
                        meter.alive.append(saved)
                    else:
                        meter.alive[-1] += saved
                    meter.live += saved
                    meter.peak = max(meter.peak, meter.live)
                else:
                    out = fn(*a, **k)
                meter.busy += time.perf_counter() - start
                return out

            return run

        def timed_backward(*a, **k):
            start = time.perf_counter()
            backward(*a, **k)
            meter.busy += time.perf_counter() - start
            meter.live -= meter.alive.popleft()

        stage.forward = saving(forward, True)
        stage.head = saving(head, False)
        engine.backward = timed_backward

    def reset(self) -> None:
        self.busy, self.peak = 0.0, self.live


def _measure(ctx: ParallelContext, config: Config, args: argparse.Namespace, run_dir: str) -> dict:
    trainer = pretraining_trainer(config, ctx, Path(run_dir))
    meter = StageMeter(trainer)
    times, busy, peaks = [], [], []
    for step in range(args.steps + 1):
        meter.reset()
        dist.barrier()
        start = time.perf_counter()
        trainer.run_step(step, trainer.task.train_batches, train=True)
        trainer.engine.step()
        if step:  # the first step warms up
            times.append(time.perf_counter() - start)
            busy.append(meter.busy)
            peaks.append(meter.peak)
    split = trainer.task.pipeline.stage.chunks  # type: ignore[union-attr]
    return {
        "time": statistics.median(times),
        "busy": statistics.median(busy),
        "peak": max(peaks),
        "layers": sum(len(c) for c in split),
    }


def _worker(rank: int, world: int, store: str, args: argparse.Namespace, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"file://{store}",
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=1800),
    )
    ctx = ParallelContext.create(pipeline=world, device=torch.device("cpu"))
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for schedule in args.schedules:
            for m in args.micros:
                layers = preset(args.model).num_layers
                if schedule == "interleaved_1f1b" and (m % world or layers % (2 * world)):
                    continue  # interleaving needs m a multiple of p and 2p equal chunks
                r = _measure(ctx, _config(args, world, schedule, m), args, f"{tmp}/{schedule}{m}")
                results.append({"part": "bubble", "schedule": schedule, "m": m, **r})
        if world == 2:
            for split in ([layers // 2] * 2, "balanced", "profile"):
                config = _config(args, world, "1f1b", args.partition_micros, split)
                config = replace(config, model=replace(config.model, vocab_size=30522))
                r = _measure(ctx, config, args, f"{tmp}/split{split}")
                results.append({"part": "split", "split": str(split), **r})
    gathered = [None] * world
    dist.all_gather_object(gathered, results)
    if rank == 0:
        Path(out).write_text(json.dumps(gathered))
    dist.destroy_process_group()


def _ideal(schedule: str, p: int, m: int, v: int) -> float:
    return 1 + (p - 1) / (v * m) if schedule == "interleaved_1f1b" else (m + p - 1) / m


def _report(world: int, per_rank: list[list[dict]], args: argparse.Namespace) -> None:
    rows = list(zip(*per_rank))  # one tuple of every stage's record per configuration
    print(
        f"\n### pipeline={world} ({args.model}, seq {args.seq}, micro-batch {args.micro}, "
        f"{world} gloo processes x 1 thread)\n"
    )
    print(
        "| schedule | m | step (s) | busiest stage per micro-batch (s) | measured slowdown "
        "| simulated | ideal (m+p-1)/m | peak saved activations per stage (MB) | theory "
        "(micro-batches alive) |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        first = row[0]
        if first["part"] != "bubble":
            continue
        m, schedule = first["m"], first["schedule"]
        v = 2 if schedule == "interleaved_1f1b" else 1
        step = max(r["time"] for r in row)
        per_micro = [r["busy"] / m for r in row]
        slowdown = step / (m * max(per_micro))
        sim = simulate(
            schedule,
            world,
            m,
            v,
            forward_time=[per_micro[i % world] / v / 3 for i in range(world * v)],
        )
        sim_slowdown = sim.makespan / (m * max(per_micro))
        alive = (
            [m] * world
            if schedule == "gpipe"
            else [min(m, world - r) for r in range(world)]
            if schedule == "1f1b"
            else sim.peak_in_flight
        )
        peaks = " / ".join(f"{r['peak'] / 2**20:.1f}" for r in row)
        print(
            f"| {schedule} | {m} | {step:.3f} | {max(per_micro):.3f} | {slowdown:.2f} | "
            f"{sim_slowdown:.2f} | {_ideal(schedule, world, m, v):.2f} | {peaks} | "
            f"{' / '.join(map(str, alive))} |"
        )
    splits = [row for row in rows if row[0]["part"] == "split"]
    if splits:
        print(
            f"\n#### partitioner (vocab 30522 MLM head on the last stage, 1f1b, "
            f"m={args.partition_micros})\n"
        )
        print("| split | layers per stage | step (s) | stage work per step (s) | vs equal |")
        print("|---|---|---|---|---|")
        base = max(r["time"] for r in splits[0])
        for row in splits:
            step = max(r["time"] for r in row)
            print(
                f"| {row[0]['split']} | {' / '.join(str(r['layers']) for r in row)} | "
                f"{step:.3f} | {' / '.join(format(r['busy'], '.3f') for r in row)} | "
                f"{step / base:.2f} |"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="bert_mini")
    parser.add_argument("--vocab", type=int, default=2048)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--micro", type=int, default=2)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--pipelines", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--micros", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--partition-micros", type=int, default=4)
    parser.add_argument("--schedules", nargs="+", default=["gpipe", "1f1b", "interleaved_1f1b"])
    args = parser.parse_args()
    for world in args.pipelines:
        with tempfile.TemporaryDirectory() as tmp:
            out = f"{tmp}/out.json"
            mp.spawn(_worker, args=(world, f"{tmp}/store", args, out), nprocs=world, join=True)
            _report(world, json.loads(Path(out).read_text()), args)


if __name__ == "__main__":
    main()
