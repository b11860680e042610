"""One-command local start: re-run an entry point on N local ranks through torch.distributed.run."""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path

from tpformer.checkpoint import store

log = logging.getLogger(__name__)


def available_devices() -> tuple[int, str]:
    import torch

    if torch.cuda.is_available():
        return torch.cuda.device_count(), "GPUs"
    return os.cpu_count() or 1, "CPUs"


def launch_local(
    module: str, overrides: list[str], *, nproc_per_node: int, max_restarts: int, run_dir: Path
) -> int:
    """Start `python -m module overrides...` on nproc_per_node local ranks (standalone rendezvous,
    gloo on CPU, NCCL on GPUs). Returns the exit code: 0; 1 if any rank failed; after SIGTERM or
    SIGINT (preemption), 0 only if the ranks saved a checkpoint of where they stopped (or
    finished), else 143 with what was lost."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main as torchrun

    devices, kind = available_devices()
    if nproc_per_node > devices:
        log.warning(
            "launcher.nproc_per_node=%d exceeds the %d %s available; ranks will share them",
            nproc_per_node,
            devices,
            kind,
        )
    args = [
        "--standalone",
        f"--nproc-per-node={nproc_per_node}",
        f"--max-restarts={max_restarts}",
        "-m",
        module,
        *overrides,
    ]
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nproc_per_node)))
    started = time.time()
    try:
        torchrun(args)
    except ChildFailedError as err:
        log.error("a rank failed: %s", err.get_first_failure()[1].message)
        return 1
    except SignalException as err:  # torch's launcher forwarded it and gave the ranks 30 s
        return _after_preemption(err.sigval.name, run_dir, started)
    return 0


def _after_preemption(signal_name: str, run_dir: Path, started: float) -> int:
    from tpformer.train.loop import STOP_RECORD

    record = run_dir / STOP_RECORD
    stop = (
        json.loads(record.read_text())
        if record.is_file() and record.stat().st_mtime >= started
        else {}
    )
    if stop.get("checkpoint") or stop.get("reason") == "done":
        log.warning(
            "launcher received %s; the ranks stopped at step %s and saved %s",
            signal_name,
            stop.get("step"),
            stop.get("checkpoint") or "(run complete)",
        )
        return 0
    latest = run_dir / store.CHECKPOINTS / store.LATEST
    kept = (
        f"the latest checkpoint is {latest.read_text().strip()}"
        if latest.is_file()
        else "no checkpoint exists"
    )
    log.error(
        "launcher received %s; the ranks stopped without saving (during startup, "
        "evaluation or a step longer than the 30 s grace): the work since the last save is "
        "lost (%s)",
        signal_name,
        kept,
    )
    return 143
