"""PipeDream's partitioner on this machine: which (split, replicas per stage) it picks for a model.

    python tools/pipedream_partition.py                      # bert_mini, micro-batch 8 x seq 64
    python tools/pipedream_partition.py --model bert_base --workers 2 4 8

Profiles each layer's, the embedding's and the head's forward + backward on one micro-batch
(`split.profile_costs`, the times `parallel.pipeline_split=profile` uses), measures the gloo
all-reduce bandwidth between two local processes (the DP synchronization of a replicated stage)
and the activation transfer, then runs `partition.pipedream_partition` for each worker count and
prints the configuration ("2-1" = stage 1 on two workers, stage 2 on one), the layers per stage
and the predicted time per micro-batch of the slowest stage, against the best plain pipeline
(one worker per stage) and plain data parallelism (one stage on every worker).
A run makes the same choice on its own model, batch and ranks with
`parallel.pipeline_schedule=pipedream parallel.pipeline_split=pipedream` (the stage count fixed
by parallel.pipeline) and runs it (docs/parallel/pipeline.md).
"""

from __future__ import annotations

import argparse
import os
import tempfile
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from tpformer.config.presets import preset
from tpformer.models import build_model
from tpformer.parallel.context import ParallelContext
from tpformer.parallel.handle import GroupHandle
from tpformer.parallel.link_timing import allreduce_bandwidth as measure_allreduce
from tpformer.planner.partition import (
    best_split,
    pipedream_partition,
    replicated_stage_time,
    replication_string,
)
from tpformer.planner.split import layer_weight_bytes, profile_costs


def _allreduce_worker(rank: int, store: str, numel: int, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"file://{store}", rank=rank, world_size=2, timeout=timedelta(60)
    )
    world = GroupHandle(dist.group.WORLD, rank, 2)
    bus = measure_allreduce(world, torch.device("cpu"), numel)
    if rank == 0:
        with open(out, "w") as f:
            f.write(str(bus))
    dist.destroy_process_group()


def allreduce_bandwidth(numel: int = 4 << 20) -> float:
    """Bytes/s of a 2-process gloo all-reduce on this machine (bus bandwidth, NCCL's convention)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "bw")
        mp.spawn(_allreduce_worker, args=(os.path.join(tmp, "store"), numel, out), nprocs=2)
        with open(out) as f:
            return float(f.read())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="bert_mini")
    parser.add_argument("--vocab", type=int, default=4000)
    parser.add_argument("--micro", type=int, default=8)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--workers", type=int, nargs="+", default=[2, 3, 4])
    args = parser.parse_args()
    torch.set_num_threads(1)
    config = preset(args.model, vocab_size=args.vocab)
    model = build_model(config, ParallelContext.single(device="cpu"), task="pretraining")
    ids = torch.randint(5, args.vocab, (args.micro, args.seq))
    sample = {
        "input_ids": ids,
        "attention_mask": torch.ones_like(ids),
        "token_type_ids": torch.zeros_like(ids),
        "mlm_labels": torch.where(torch.rand(ids.shape) < 0.15, ids, -100),
        "nsp_labels": torch.zeros(args.micro, dtype=torch.long),
    }
    costs = profile_costs(model, sample)
    layer_bytes = layer_weight_bytes(model)
    bandwidth = allreduce_bandwidth()
    print(
        f"{args.model}, micro-batch {args.micro} x seq {args.seq}: layers "
        f"{', '.join(f'{t * 1e3:.1f}' for t in costs.layers)} ms, embedding "
        f"{costs.embedding * 1e3:.1f} ms, head {costs.head * 1e3:.1f} ms (forward + backward); "
        f"weights {sum(layer_bytes) / 1e6:.1f} MB; all-reduce {bandwidth / 1e9:.2f} GB/s"
    )
    print(f"{'workers':>7s}  {'config':8s} {'layers':12s} {'slowest ms':>10s}  "
          f"{'pipeline only':>13s}  {'DP only':>7s}")  # fmt: skip
    for workers in args.workers:
        stages, slowest = pipedream_partition(costs, layer_bytes, workers, bandwidth)
        plain = (
            max(costs.of_split(best_split(costs, workers)))
            if workers <= len(costs.layers)
            else float("nan")
        )
        dp_only = replicated_stage_time(  # one stage on every worker: plain data parallelism
            costs.stage_cost(0, len(costs.layers)), sum(layer_bytes), workers, bandwidth
        )
        print(
            f"{workers:7d}  {replication_string(stages):8s} "
            f"{[s.layers for s in stages]!s:12s} {slowest * 1e3:10.1f}  "
            f"{plain * 1e3:13.1f}  {dp_only * 1e3:7.1f}"
        )


if __name__ == "__main__":
    main()
