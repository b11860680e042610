"""Link timing for the planner: the collectives a run issues, timed between two processes over
gloo (calibration: planner/calibrate.py spawns two ranks of it), and the all-reduce bandwidth
among a run's ranks (PipeDream's partitioner, planner/split.py). Here because it creates a
process group and calls torch.distributed, which only parallel/ does."""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch import Tensor

from tpformer.parallel.comm import all_gather_async, process_group, reduce_scatter_async, wait
from tpformer.parallel.handle import GroupHandle


def time_collectives(
    rank: int, store: str, out: str, collectives: tuple[str, ...], sizes: tuple[int, ...]
) -> None:
    """Time, between two ranks, the collectives the run uses: the TP all-reduce, the engine's
    all-gather and reduce-scatter (tpformer.parallel.comm; pairwise exchanges on 2 gloo
    ranks) and the pipeline's send/receive."""
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"file://{store}",
        rank=rank,
        world_size=2,
        timeout=timedelta(seconds=300),
    )
    handle = GroupHandle(dist.group.WORLD, rank, 2)

    def run(op: str, x: Tensor) -> None:
        if op == "all_reduce":
            dist.all_reduce(x)
        elif op == "all_gather":
            half = x.numel() // 2
            wait(all_gather_async(x, x[rank * half : (rank + 1) * half].clone(), handle))
        elif op == "reduce_scatter":
            wait(reduce_scatter_async(torch.empty(x.numel() // 2), x, handle))
        elif rank == 0:
            dist.send(x, 1)
        else:
            dist.recv(x, 0)

    times: dict[str, list[list[float]]] = {}
    for op in collectives:
        for nbytes in sizes:  # a fixed number of repeats: every rank issues as many
            x = torch.ones(nbytes // 4)
            run(op, x)
            samples = []
            for _ in range(max(5, 2**22 // nbytes)):
                dist.barrier()
                start = time.perf_counter()
                run(op, x)
                samples.append(time.perf_counter() - start)
            times.setdefault(op, []).append([nbytes, statistics.median(samples)])
    # the slower rank's medians
    flat = torch.tensor([t for op in collectives for _, t in times[op]], dtype=torch.float64)
    dist.all_reduce(flat, op=dist.ReduceOp.MAX)
    agreed = iter(flat.tolist())
    if rank == 0:
        Path(out).write_text(
            json.dumps({op: [[n, next(agreed)] for n, _ in times[op]] for op in collectives})
        )
    dist.destroy_process_group()


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work (a no-op on the CPU, whose ops run as called)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def median_seconds(fn: Callable[[], object], device: torch.device, repeats: int = 3) -> float:
    """Median wall time of `repeats` calls of fn, after one untimed call (lazy init, the
    allocator's first blocks); the device is synchronized before and after each, so on a GPU
    the time is the kernels' and not their launch."""
    fn()
    times = []
    for _ in range(repeats):
        synchronize(device)
        start = time.perf_counter()
        fn()
        synchronize(device)
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def allreduce_bandwidth(handle: GroupHandle, device: torch.device, numel: int = 1 << 22) -> float:
    """Bus bandwidth (bytes/s, NCCL's convention: 2 (n - 1) / n x bytes / time) of an all-reduce
    over `handle` on this device: median of 3 after a warm-up. Every rank of it must call."""
    if handle.size == 1:
        return float("inf")
    x = torch.ones(numel, device=device)
    group = process_group(handle)

    seconds = median_seconds(lambda: dist.all_reduce(x, group=group), device)
    return 2 * (handle.size - 1) / handle.size * x.nbytes / seconds
