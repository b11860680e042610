"""ZeRO stages against DDP, FSDP2 (`fully_shard`) and ZeroRedundancyOptimizer on 2 gloo ranks.

    python tools/benchmark_zero.py                       # speed: bert_small, interleaved rounds
    python tools/benchmark_zero.py --memory --model bert_base   # peak RSS, one fresh pair each

Speed mode builds every contender in the same 2 processes (1 thread each) and gives each a turn
of `--steps-per-turn` forward+backward+AdamW steps per round, in an order rotated every round, so
noise hits all alike. A turn ends when its own communication has finished (tpformer's ZeRO-1/2
overlap the post-step all-gather with the next forward; the last one of a turn is waited for
inside the timed window rather than left to slow the next contender). It prints the median
tokens/s, the median and interquartile range over rounds of the paired ratio DDP time /
contender time, and accounted model-state bytes per rank against DDP. Memory mode
starts a fresh pair of processes per contender (peak RSS is a process high-water mark), runs a
few steps and prints the peak RSS per rank next to DDP's.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import resource
import statistics
import tempfile
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from tpformer.config.presets import preset
from tpformer.config.schema import OptimConfig, ParallelConfig
from tpformer.engine.parallelize import parallelize
from tpformer.layers.block import TransformerLayer
from tpformer.models import build_model
from tpformer.parallel.context import ParallelContext

SEQ, MICRO_BATCH, MASK_RATE = 128, 8, 0.15
OPTIM = OptimConfig(lr=1e-4, clip_grad=0.0)
CONTENDERS = [
    "DDP",
    "ZeroRedundancyOptimizer",
    "FSDP2 (fully_shard)",
    "tpformer ZeRO-0",
    "tpformer ZeRO-1",
    "tpformer ZeRO-2",
    "tpformer ZeRO-3",
]


def make_batch(rank: int, vocab: int, micro_batch: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(rank)
    ids = torch.randint(5, vocab, (micro_batch, SEQ), generator=g)
    labels = torch.full_like(ids, -100)
    masked = torch.rand(micro_batch, SEQ, generator=g) < MASK_RATE
    labels[masked] = ids[masked]
    return {
        "input_ids": ids,
        "attention_mask": torch.ones_like(ids),
        "mlm_labels": labels,
        "nsp_labels": torch.randint(0, 2, (micro_batch,), generator=g),
    }


def _bytes(tensors) -> int:
    total = 0
    for t in tensors:
        if hasattr(t, "to_local"):
            t = t.to_local()
        total += t.numel() * t.element_size()
    return total


def _optimizer_bytes(opt: torch.optim.Optimizer) -> int:
    return _bytes(
        v
        for s in opt.state.values()
        for v in s.values()
        if isinstance(v, torch.Tensor) and v.numel() > 1
    )


class Contender:
    """One training setup: step() runs forward+backward+update; accounted() gives bytes."""

    def __init__(self, name: str, model_name: str, ctx: ParallelContext, micro_batch: int) -> None:
        from torch.nn.parallel import DistributedDataParallel as DDP

        self.name, self.ctx = name, ctx
        self.model = build_model(
            preset(model_name, dropout=0.0, attention_dropout=0.0), ctx, task="pretraining"
        )
        self.batch = make_batch(ctx.rank, self.model.config.vocab_size, micro_batch)
        self.engine = None
        params = dict(lr=OPTIM.lr, weight_decay=OPTIM.weight_decay, fused=True)
        if name.startswith("tpformer"):
            stage = int(name[-1])
            self.engine = parallelize(
                self.model, ParallelConfig(zero_stage=stage), OPTIM, ctx
            ).engine
        elif name == "DDP":
            self.model = DDP(self.model, process_group=ctx.dp.group)
            self.opt = torch.optim.AdamW(self.model.parameters(), **params)
        elif name == "ZeroRedundancyOptimizer":
            from torch.distributed.optim import ZeroRedundancyOptimizer

            self.model = DDP(self.model, process_group=ctx.dp.group)
            self.opt = ZeroRedundancyOptimizer(
                self.model.parameters(), torch.optim.AdamW, process_group=ctx.dp.group, **params
            )
        else:
            from torch.distributed.fsdp import fully_shard

            for module in self.model.modules():
                if isinstance(module, TransformerLayer):
                    fully_shard(module, mesh=ctx.mesh["dp"])
            fully_shard(self.model, mesh=ctx.mesh["dp"])
            self.opt = torch.optim.AdamW(
                self.model.parameters(), lr=OPTIM.lr, weight_decay=OPTIM.weight_decay
            )

    def step(self) -> None:
        loss = self.model(**self.batch).loss
        if self.engine is not None:
            self.engine.backward(loss / self.ctx.dp.size)  # the engine sums, DDP/FSDP average
            self.engine.step()
            return
        loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=False)

    def settle(self) -> None:
        """Wait for communication still in flight (only tpformer's engine leaves any)."""
        if self.engine is not None:
            self.engine.settle()

    def accounted(self) -> int:
        if self.engine is not None:
            return self.engine.memory_report().total
        params = list(self.model.parameters())
        grads = [p.grad for p in params if p.grad is not None]
        return (
            _bytes(params) + _bytes(grads) + _optimizer_bytes(getattr(self.opt, "optim", self.opt))
        )


def _init(rank: int, world: int, store: str) -> ParallelContext:
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"file://{store}",
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=900),
    )
    return ParallelContext.create(tensor=1, device=torch.device("cpu"))


def _speed_worker(rank: int, world: int, store: str, args, queue) -> None:
    ctx = _init(rank, world, store)
    contenders = [Contender(name, args.model, ctx, args.micro_batch) for name in CONTENDERS]
    times: dict[str, list[float]] = {c.name: [] for c in contenders}
    for round_ in range(args.warmup + args.rounds):
        shift = round_ % len(contenders)
        for c in contenders[shift:] + contenders[:shift]:
            dist.barrier()
            start = time.perf_counter()
            for _ in range(args.steps_per_turn):
                c.step()
            c.settle()
            dist.barrier()
            if round_ >= args.warmup:
                times[c.name].append((time.perf_counter() - start) / args.steps_per_turn)
    if rank == 0:
        queue.put({c.name: (times[c.name], c.accounted()) for c in contenders})
    ctx.destroy()


def _memory_worker(rank: int, world: int, store: str, args, name: str, queue) -> None:
    ctx = _init(rank, world, store)
    contender = Contender(name, args.model, ctx, args.micro_batch)
    for _ in range(args.memory_steps):
        contender.step()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    queue.put((rank, peak, contender.accounted()))
    ctx.destroy()


def _paired_ratio_quartiles(base: list[float], times: list[float]) -> list[float]:
    """Quartiles over rounds of DDP's step time / this contender's, both taken in the same
    round: a slow spell of a shared machine hits both sides of each ratio alike."""
    ratios = [b / t for b, t in zip(base, times)]
    return statistics.quantiles(ratios, n=4, method="inclusive")


def _spawn(target, world: int, *extra) -> list:
    mpctx = mp.get_context("spawn")
    queue = mpctx.Queue()
    store = os.path.join(tempfile.mkdtemp(), "store")
    procs = [
        mpctx.Process(target=target, args=(r, world, store, *extra, queue)) for r in range(world)
    ]
    for p in procs:
        p.start()
    results = [queue.get(timeout=3600) for _ in range(world if target is _memory_worker else 1)]
    for p in procs:
        p.join()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--model", default=None, help="preset (bert_small; bert_base with --memory)"
    )
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--steps-per-turn", type=int, default=2)
    parser.add_argument("--memory", action="store_true", help="peak RSS, one process pair each")
    parser.add_argument("--memory-steps", type=int, default=3)
    parser.add_argument("--micro-batch", type=int, default=MICRO_BATCH, help="samples per rank")
    parser.add_argument(
        "--contenders",
        nargs="+",
        default=CONTENDERS,
        choices=CONTENDERS,
        metavar="NAME",
        help="memory mode: which to run (DDP always first)",
    )
    args = parser.parse_args()
    args.model = args.model or ("bert_base" if args.memory else "bert_small")
    world, tokens = 2, 2 * args.micro_batch * SEQ
    print(
        f"{args.model}, 2 ranks x 1 thread (gloo), micro-batch {args.micro_batch} x seq {SEQ} per "
        "rank, fp32, AdamW"
    )
    if not args.memory:
        measured = _spawn(_speed_worker, world, args)[0]
        base_times, base_b = measured["DDP"]
        print(
            f"{'contender':26s} {'step s':>7s} {'tokens/s':>9s} {'vs DDP':>7s} {'IQR':>11s} "
            f"{'accounted MB/rank':>18s} {'vs DDP':>7s}"
        )
        for name, (times, b) in measured.items():
            t = statistics.median(times)
            q1, ratio, q3 = _paired_ratio_quartiles(base_times, times)
            print(
                f"{name:26s} {t:7.3f} {tokens / t:9.0f} {ratio:7.2f} {q1:5.2f}-{q3:<5.2f} "
                f"{b / 2**20:18.1f} {b / base_b:7.2f}"
            )
        return
    print(f"{'contender':26s} {'peak RSS MB/rank':>17s} {'vs DDP':>7s} {'accounted MB/rank':>18s}")
    rows = {}
    for name in ["DDP", *[c for c in args.contenders if c != "DDP"]]:
        results = _spawn(_memory_worker, world, args, name)
        rows[name] = (max(r[1] for r in results), max(r[2] for r in results))
        peak, acc = rows[name]
        print(
            f"{name:26s} {peak / 2**20:17.0f} {peak / rows['DDP'][0]:7.2f} {acc / 2**20:18.1f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
