"""One-command local start: re-run an entry point on N local ranks through torch.distributed.run."""

from __future__ import annotations

import logging
import os

log = logging.getLogger(__name__)


def available_devices() -> tuple[int, str]:
    import torch

    if torch.cuda.is_available():
        return torch.cuda.device_count(), "GPUs"
    return os.cpu_count() or 1, "CPUs"


def launch_local(module: str, overrides: list[str], *, nproc_per_node: int, max_restarts: int) -> int:
    """Start `python -m module overrides...` on nproc_per_node local ranks (standalone rendezvous,
    gloo on CPU, NCCL on GPUs). Returns the exit code: 0, or 1 if any rank failed."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main as torchrun

    devices, kind = available_devices()
    if nproc_per_node > devices:
        log.warning("launcher.nproc_per_node=%d exceeds the %d %s available; ranks will share them",
                    nproc_per_node, devices, kind)
    args = ["--standalone", f"--nproc-per-node={nproc_per_node}", f"--max-restarts={max_restarts}",
            "-m", module, *overrides]
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nproc_per_node)))
    try:
        torchrun(args)
    except ChildFailedError as err:
        log.error("a rank failed: %s", err.get_first_failure()[1].message)
        return 1
    except SignalException as err:  # preemption: the ranks got it too and checkpoint themselves
        log.warning("launcher received %s; the ranks save a checkpoint and stop", err.sigval.name)
        return 0
    return 0

