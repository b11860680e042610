"""A job that fails while running says so once: each rank that fails on bad data, a damaged
checkpoint or a failed write (shell.JOB_ERRORS) leaves its one-line message in a folder the
local launcher names (TPFORMER_FAILURE_DIR) instead of printing it, and the launcher prints one
line: the message, and which ranks failed with it. Under a launcher of the user's own (torchrun,
srun) every rank logs its message as before; there is nobody else to print it."""

from __future__ import annotations

import logging
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import NoReturn

from tpformer.parallel.env import LaunchEnv

log = logging.getLogger("tpformer")


def record_failure(env: LaunchEnv, rank: int, message: str) -> None:
    """This rank's failure: kept for the launcher to print, and in rank 0's train.log; logged
    to the console when no tpformer launcher collects it."""
    if env.failure_dir is None:
        log.error("%s", message)
        return
    folder = Path(env.failure_dir)
    (folder / f"attempt{env.restart_count:03d}.rank{rank:05d}.txt").write_text(message)
    record = log.makeRecord(log.name, logging.ERROR, __file__, 0, "%s", (message,), None)
    for handler in logging.getLogger().handlers:  # train.log only, not the console
        if isinstance(handler, logging.FileHandler):
            handler.handle(record)


@contextmanager
def collected_failures() -> Iterator[Path]:
    """A folder for the ranks' messages for the length of a launch."""
    with tempfile.TemporaryDirectory(prefix="tpformer-failures-") as folder:
        yield Path(folder)


def failure_line(folder: Path, failed: dict[int, str]) -> str:
    """One line for a failed launch: the last attempt's messages with the ranks that gave each,
    or, for ranks that left none (a crash with a traceback, a signal), how they ended
    (`failed`: global rank -> torch's description of its exit)."""
    files = sorted(folder.glob("attempt*.rank*.txt"))
    last = max((f.name.split(".")[0] for f in files), default=None)
    by_message: dict[str, list[int]] = {}
    for file in (f for f in files if f.name.split(".")[0] == last):
        rank = int(file.name.split(".")[1].removeprefix("rank"))
        by_message.setdefault(file.read_text().strip(), []).append(rank)
    if by_message:
        return "; ".join(f"{message} ({_ranks(ranks)})" for message, ranks in by_message.items())
    return "; ".join(f"rank {rank} {how}" for rank, how in sorted(failed.items()))


def _ranks(ranks: list[int]) -> str:
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    return "ranks " + ", ".join(str(r) for r in ranks)


PEER_LOST = ("connection reset by peer", "connection closed by peer", "broken pipe")
"""What gloo says when a peer rank's process is gone (killed, crashed) mid-collective."""

PEER_LOST_GRACE_S = 2.0
"""How long a rank that lost a peer waits before it exits: the local launcher reports the first
rank it sees end (every 0.1 s it looks), which must be the peer that ended first, not this one."""


def lost_a_peer(err: BaseException) -> bool:
    """Whether a collective failed because another rank's process ended."""
    text = str(err).lower()
    return any(words in text for words in PEER_LOST)


def after_a_lost_peer(rank: int, err: RuntimeError) -> NoReturn:
    """A consequence, not a cause: one line instead of a traceback, and an exit after the
    peer's (the launcher ends this rank sooner when it sees the peer gone)."""
    reason = str(err).strip().splitlines()[0].split(". This is")[0]  # gloo's advice cut
    log.error(
        "rank %d lost its connection to another rank, whose process ended first; the launcher "
        "names it [%s]",
        rank,
        reason,
    )
    time.sleep(PEER_LOST_GRACE_S)
    sys.exit(1)
