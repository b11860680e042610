"""A real `tpformer-pretrain` job for fault tests: started in its own session, its ranks found
through /proc, and every process it started ended when the test ends, however it ends."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from tests.train.test_trainer import REPO, TINY


def children(pid: int) -> list[int]:
    """Direct children of `pid` (the ranks under a launcher), from /proc."""
    kids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            kids.append(int(stat.parent.name))
    return sorted(kids)


def alive(pid: int) -> bool:
    """Running or stopped, not a zombie."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


class Job:
    """`python -m tpformer.cli.pretrain <overrides>` on N local ranks, writing into run_dir."""

    def __init__(self, run_dir: Path, *overrides: str, nproc: int = 2) -> None:
        self.run_dir = run_dir
        run_dir.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
        self.log = run_dir / "job.log"
        with self.log.open("w") as out:  # a file, not a pipe nobody drains while we wait
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "tpformer.cli.pretrain",
                    *TINY,
                    *overrides,
                    f"launcher.nproc_per_node={nproc}",
                    f"hydra.run.dir={run_dir}",
                ],
                cwd=run_dir,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.started = time.monotonic()
        self._seen: set[int] = set()

    def ranks(self) -> list[int]:
        kids = children(self.proc.pid)
        self._seen.update(kids)
        return kids

    def wait_for(
        self, condition: Callable[[], bool], timeout: float = 180.0, poll: float = 0.1
    ) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(
                    f"waited {timeout:.0f} s in vain; job exit code "
                    f"{self.proc.poll()}:\n{self.output()[-3000:]}"
                )
            time.sleep(poll)

    def wait_ranks(self, count: int = 2) -> list[int]:
        self.wait_for(lambda: len(self.ranks()) == count)
        return self.ranks()

    def finish(self, timeout: float = 300.0) -> tuple[int, float]:
        """(exit code, seconds from now until the launcher exited)."""
        start = time.monotonic()
        self.proc.wait(timeout=timeout)
        return self.proc.returncode, time.monotonic() - start

    def output(self) -> str:
        return self.log.read_text() if self.log.exists() else ""

    def close(self) -> None:
        """End the launcher and every rank it ever had (ranks run in sessions of their own)."""
        self.ranks()
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)
        for pid in self._seen:
            if alive(pid):
                os.kill(pid, signal.SIGKILL)

    def __enter__(self) -> Job:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
