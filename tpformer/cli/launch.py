"""One-command local start: re-run an entry point on N local ranks through torch.distributed.run."""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from tpformer.checkpoint import store
from tpformer.parallel.env import FAILURE_DIR_VAR

if TYPE_CHECKING:
    from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

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
    gloo on CPU, NCCL on GPUs). Returns the exit code: 0; 1 if any rank failed (said in one line,
    cli/failures.py); after SIGTERM or SIGINT (preemption), 0 only if the ranks saved a
    checkpoint of where they stopped (or finished), else 143 with what was lost."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    from tpformer.cli.failures import collected_failures, failure_line

    devices, kind = available_devices()
    if nproc_per_node > devices:
        log.warning(
            "launcher.nproc_per_node=%d exceeds the %d %s available; ranks will share them",
            nproc_per_node,
            devices,
            kind,
        )
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nproc_per_node)))
    started = time.time()
    with collected_failures() as folder, _quiet_launcher(restarts=max_restarts > 0):
        os.environ[FAILURE_DIR_VAR] = str(folder)
        try:
            _run_torch_launcher(module, overrides, nproc_per_node, max_restarts)
        except ChildFailedError as err:
            failed = {rank: _ending(failure) for rank, failure in err.failures.items()}
            print(f"error: {failure_line(folder, failed)}", file=sys.stderr, flush=True)
            return 1
        except SignalException as err:  # torch's launcher forwarded it and gave the ranks 30 s
            return _after_preemption(err.sigval.name, run_dir, started)
        finally:
            os.environ.pop(FAILURE_DIR_VAR, None)
    return 0


def _run_torch_launcher(
    module: str, overrides: list[str], nproc_per_node: int, max_restarts: int
) -> None:
    """torch's launcher, as `torchrun --standalone` takes it, over `module`'s console script: its
    ranks forked from this process on the CPU (cli/forked_ranks.py), fresh interpreters on
    GPUs."""
    import uuid

    from torch.distributed.launcher.api import elastic_launch
    from torch.distributed.run import config_from_args, parse_args

    from tpformer.cli.forked_ranks import can_fork_ranks, run_rank

    launch = [f"--nproc-per-node={nproc_per_node}", f"--max-restarts={max_restarts}"]
    parsed = parse_args([*launch, "-m", module, *overrides])
    # --standalone: a c10d rendezvous on a free local port
    parsed.rdzv_backend, parsed.rdzv_endpoint, parsed.rdzv_id = (
        "c10d",
        "localhost:0",
        str(uuid.uuid4()),
    )
    config, command, command_args = config_from_args(parsed)
    if not can_fork_ranks():
        elastic_launch(config, entrypoint=command)(*command_args)
        return
    config.start_method = "fork"
    sys.stdout.flush()  # what this process printed must not be printed again by each rank
    sys.stderr.flush()
    elastic_launch(config, entrypoint=run_rank)(module, *overrides)


def _ending(failure: ProcessFailure) -> str:
    if failure.exitcode < 0:
        return f"was killed by {failure.signal_name()}"
    return f"exited with code {failure.exitcode}"


@contextmanager
def _quiet_launcher(*, restarts: bool) -> Iterator[None]:
    """Without restarts, torch's launcher's own log lines about a failure (the signals it sends,
    the exit codes, the forked ranks it terminates, a pointer to its traceback docs) say less
    than the one line printed after it; with restarts they are the only word of a restarted
    attempt, and stay."""
    loggers = [
        logging.getLogger(name)
        for name in list(logging.Logger.manager.loggerDict)
        if name.startswith(("torch.distributed.elastic", "torch.multiprocessing")) and not restarts
    ]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)


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
        "evaluation, or steps longer than the 30 s grace: the ranks agree to stop one step "
        "after the signal): the work since the last save is lost (%s)",
        signal_name,
        kept,
    )
    return 143
