"""A deliberately wrong 2-rank program for the hang-report test: each step all-reduces over TP
and then over a second group; rank 1 skips the TP all-reduce of step 1 and waits in the second
group's, which rank 0 never reaches. Run:
torchrun --standalone --nproc-per-node 2 skipped_collective.py RUN_DIR TIMEOUT_S"""

from __future__ import annotations

import logging
import sys
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from tpformer.cli.shell import report_collective_timeout
from tpformer.parallel.comm import all_reduce
from tpformer.parallel.context import ParallelContext
from tpformer.parallel.handle import GroupHandle


def main() -> None:
    run_dir, timeout_s = Path(sys.argv[1]), float(sys.argv[2])
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    ctx = ParallelContext.create(2, 1, seed=0, timeout_s=timeout_s)
    group = dist.new_group(backend="gloo", timeout=timedelta(seconds=timeout_s))
    ctx.monitor.recorder.name_group(group, "second")
    second = GroupHandle(group=group, rank=ctx.rank, size=2, monitor=ctx.monitor)
    x = torch.ones(4)
    try:
        for step in range(3):
            if not (ctx.rank == 1 and step == 1):
                all_reduce(x, ctx.tp)  # SKIPPED_LINE: rank 1 skips it at step 1
            all_reduce(x, second)
    except RuntimeError as err:
        report_collective_timeout(ctx, run_dir, err, timeout_s)
        sys.exit(1)


if __name__ == "__main__":
    main()
