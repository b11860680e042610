"""run_distributed: spawn gloo ranks from a test, each with a ParallelContext, and collect results.

Ranks start from a forkserver that has already imported torch and the training stack (fast, and
fork-safe because the server never ran a parallel region), rendezvous through a file in a temp
dir (no port races), and run with one intra-op thread each. A rank that raises fails the test
with its traceback; a rank that hangs is killed at the deadline, so CI never waits forever.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import shutil
import tempfile
import time
import traceback
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from tpformer.config.schema import ParallelConfig, RngMode
from tpformer.parallel.context import ParallelContext

DEFAULT_TIMEOUT_S = 180.0


def _worker(
    fn: Callable[..., Any],
    args: tuple,
    rank: int,
    world_size: int,
    workdir: str,
    config: ParallelConfig,
    timeout_s: float,
) -> None:
    out = Path(workdir)
    try:
        torch.set_num_threads(1)
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        dist.init_process_group(
            "gloo",
            init_method=f"file://{out / 'store'}",
            rank=rank,
            world_size=world_size,
            timeout=timedelta(seconds=timeout_s),
        )
        ctx = ParallelContext.create(
            config.tensor,
            config.data,
            seed=config.seed,
            timeout_s=timeout_s,
            sequence_parallel=config.sequence_parallel,
            pipeline=config.pipeline,
            rng=str(config.rng),
            gloo_shortcuts=config.gloo_shortcuts,
            context=config.context,
            replicas=config.pipeline_replicas,
        )
        try:
            result = fn(ctx, *args)
            if dist.is_initialized():  # no rank tears its groups down while another sets one up
                dist.barrier()
        finally:
            ctx.destroy()
        torch.save(result, out / f"result{rank}.pt")
    except BaseException:
        (out / f"error{rank}.txt").write_text(traceback.format_exc())
        os._exit(1)


def forkserver_context() -> mp.context.BaseContext:
    """The suite's forkserver: ranks (here) and console scripts (tests/cli/forked.py) fork
    from it with what they import already loaded."""
    ctx = mp.get_context("forkserver")
    # the training stack too (torch.distributed.checkpoint alone is 0.7 s of imports): every
    # rank is forked with it loaded (measured: 45 s -> 37 s over 12 two-rank training tests);
    # torch._dynamo, which torch.optim imports when the first optimizer is built (about 1 s a
    # rank: 137 s -> 107 s over the checkpoint and ZeRO tests), transformers (the HF tests), and
    # the suite's inductor settings (tests/inductor_settings.py), Hydra and the console
    # scripts the tests run (tests/cli/forked.py)
    ctx.set_forkserver_preload(
        [
            "torch",
            "torch._dynamo",
            "transformers",
            "tpformer.parallel",
            "tests.dist",
            "tests.inductor_settings",
            "tpformer.train.pretraining",
            "tests.cli.forked",
            "tpformer.cli.pretrain",
            "tpformer.cli.finetune",
        ]
    )
    return ctx


def start_ranks(
    fn: Callable[..., Any],
    world_size: int,
    *args: Any,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    tensor: int = 1,
    data: str | int = "auto",
    seed: int = 1234,
    sequence_parallel: bool = False,
    pipeline: int = 1,
    rng: str = "exact",
    gloo_shortcuts: bool = True,
    context: int = 1,
    replicas: list[int] | None = None,
) -> tuple[list[mp.process.BaseProcess], str]:
    """Start fn(ctx, *args) on `world_size` gloo ranks without waiting; returns the processes
    and their work directory (for tests that kill ranks themselves)."""
    config = ParallelConfig(
        tensor=tensor,
        data=str(data),
        seed=seed,
        sequence_parallel=sequence_parallel,
        pipeline=pipeline,
        rng=RngMode(rng),
        gloo_shortcuts=gloo_shortcuts,
        context=context,
        pipeline_replicas=list(replicas or []),
    )
    workdir = tempfile.mkdtemp(prefix="tpformer-dist-")
    mpctx = forkserver_context()
    procs = [
        mpctx.Process(target=_worker, args=(fn, args, r, world_size, workdir, config, timeout_s))
        for r in range(world_size)
    ]
    for p in procs:
        p.start()
    return procs, workdir


def run_distributed(
    fn: Callable[..., Any],
    world_size: int,
    *args: Any,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    tensor: int = 1,
    data: str | int = "auto",
    seed: int = 1234,
    sequence_parallel: bool = False,
    pipeline: int = 1,
    rng: str = "exact",
    gloo_shortcuts: bool = True,
    context: int = 1,
    replicas: list[int] | None = None,
) -> list[Any]:
    """Run fn(ctx, *args) on `world_size` gloo ranks; return each rank's return value, by rank.

    fn and args must be picklable (a module-level function of a test module)."""
    procs, workdir = start_ranks(
        fn,
        world_size,
        *args,
        timeout_s=timeout_s,
        tensor=tensor,
        data=data,
        seed=seed,
        sequence_parallel=sequence_parallel,
        pipeline=pipeline,
        rng=rng,
        gloo_shortcuts=gloo_shortcuts,
        context=context,
        replicas=replicas,
    )
    try:
        deadline = time.monotonic() + timeout_s + 30
        while any(p.is_alive() for p in procs):
            failed = [r for r, p in enumerate(procs) if p.exitcode not in (None, 0)]
            if failed or time.monotonic() > deadline:
                time.sleep(0.5 if failed else 0)  # let the first error file land
                break
            time.sleep(0.02)
        for p in procs:
            if p.is_alive():
                p.kill()
            p.join()
        errors = sorted(Path(workdir).glob("error*.txt"), key=lambda e: e.stat().st_mtime)
        if errors:
            raise AssertionError(f"{errors[0].stem} failed:\n{errors[0].read_text()}")
        hung = [r for r, p in enumerate(procs) if p.exitcode != 0]
        if hung:
            raise AssertionError(f"ranks {hung} did not finish within {timeout_s:.0f}s")
        return [
            torch.load(Path(workdir) / f"result{r}.pt", weights_only=False)
            for r in range(world_size)
        ]
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
