"""Saved activations per rank with and without sequence parallelism, next to the formulas, and
the step-time ratio of SP at TP=2, in one run.

    python tools/benchmark_sequence_parallel.py                    # bert_base, seq 512, TP 2 and 4
    python tools/benchmark_sequence_parallel.py --model bert_small --seq 256 --rounds 2

For each TP degree the tool starts that many gloo processes (1 thread each) and measures, with
saved-tensor hooks over one forward (parameters excluded, each storage once), what every
transformer layer keeps for backward in three settings: TP alone, TP + SP, TP + SP + selective
recomputation. The formulas are Korthikanti et al. 2022's per-layer terms
(sbh(10 + 24/t + 5as/(ht)), sbh/t (34 + 5as/h), 34 sbh/t for 16-bit tensors) in the fp32 form
the planner and startup plan use (tpformer.planner.memory.layer_activation_bytes: 4-byte
tensors, and 4-byte masks, CPU fp32 dropout's float masks). Step time (forward + backward) of
TP=2 with and without SP is measured in the same processes, the two interleaved round by
round, medians reported.
"""

from __future__ import annotations

import argparse
import dataclasses
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
from tpformer.config.schema import ModelConfig, ParallelConfig
from tpformer.engine.memory import measure_saved_activations
from tpformer.engine.recompute import apply_recompute
from tpformer.models import build_model
from tpformer.parallel.context import ParallelContext
from tpformer.planner.layer_memory import layer_activation_bytes

SETTINGS = (
    ("TP", False, "none"),
    ("TP + SP", True, "none"),
    ("TP + SP + selective", True, "selective"),
)


def _batch(config: ModelConfig, seq: int, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, config.vocab_size, (batch, seq), generator=g)
    labels = torch.where(torch.rand(ids.shape, generator=g) < 0.15, ids, -100)
    return ids, labels


def _worker(rank: int, world: int, store: str, args: argparse.Namespace, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"file://{store}",
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=1800),
    )
    base = ParallelContext.create(tensor=world, device=torch.device("cpu"))
    config = preset(args.model, vocab_size=30522, max_position_embeddings=max(512, args.seq))
    ids, labels = _batch(config, args.seq, args.batch)
    models = {}
    saved = {}
    for name, sp, recompute in SETTINGS:
        ctx = dataclasses.replace(base, sequence_parallel=sp)
        model = build_model(config, ctx, task="pretraining").train()
        apply_recompute(model, ParallelConfig(recompute=recompute), ctx.rng)
        result = measure_saved_activations(model, lambda m=model: m(ids, mlm_labels=labels).loss)
        saved[name] = statistics.mean(result.per_layer)
        model.zero_grad(set_to_none=True)
        if recompute == "none" and world == 2:
            models[name] = model
    times: dict[str, list[float]] = {name: [] for name in models}
    for round_ in range(args.rounds + 1 if models else 0):  # the first round warms up
        for name, model in models.items():
            dist.barrier()
            start = time.perf_counter()
            model(ids, mlm_labels=labels).loss.backward()
            dist.barrier()
            if round_:
                times[name].append(time.perf_counter() - start)
            model.zero_grad(set_to_none=True)
    if rank == 0:
        with open(out, "w") as f:
            json.dump({"saved": saved, "times": times}, f)
    base.destroy()


def _run(tp: int, args: argparse.Namespace) -> dict:
    workdir = tempfile.mkdtemp(prefix="tpformer-sp-")
    out = os.path.join(workdir, "result.json")
    mp.spawn(_worker, args=(tp, os.path.join(workdir, "store"), args, out), nprocs=tp)
    with open(out) as f:
        return json.load(f)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="bert_base")
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--tp", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    config = preset(args.model, vocab_size=30522)
    s, b = args.seq, args.batch
    h, a, f = config.hidden_size, config.num_heads, config.intermediate_size
    mb = 2**20
    print(
        f"{args.model} ({config.num_layers} layers, hidden {h}, {a} heads, FFN {f}), seq {s}, "
        f"batch {b}, fp32, dropout {config.dropout}; saved activations per layer per rank, "
        "measured with saved-tensor hooks (gloo processes, 1 thread each)"
    )
    print(
        "| TP | setting | measured (MB/layer) | formula (MB/layer) | measured / formula "
        "| vs TP alone |"
    )
    print("|---|---|---|---|---|---|")
    timing = None
    for tp in args.tp:
        result = _run(tp, args)
        alone = result["saved"]["TP"]
        for name, sp, recompute in SETTINGS:
            got = result["saved"][name]
            want = layer_activation_bytes(
                s,
                b,
                h,
                a,
                f,
                tp=tp,
                sequence_parallel=sp,
                recompute=recompute,
                itemsize=4,
                mask_bytes=4,
            )
            print(
                f"| {tp} | {name} | {got / mb:.2f} | {want / mb:.2f} | {got / want:.3f} | "
                f"{got / alone:.2f} |"
            )
        if result["times"]:
            timing = result["times"]
    if timing:
        plain, sp = statistics.median(timing["TP"]), statistics.median(timing["TP + SP"])
        print(
            f"\nTP=2 forward+backward, median of {args.rounds} interleaved rounds: "
            f"TP {plain:.2f} s, TP + SP {sp:.2f} s, ratio SP / TP {sp / plain:.2f}"
        )


if __name__ == "__main__":
    main()
