"""Faults of processes, staged for real on a 2-rank gloo job: a killed rank, a stopped (hung)
rank, SIGTERM at startup and during a save, a killed launcher. Each test bounds its own time
generously (a loaded 2-core machine is slow) and ends every process it started."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from tests.faults.job import Job, alive
from tpformer.checkpoint import store

pytestmark = pytest.mark.slow


def _training(job: Job) -> bool:
    return (job.run_dir / "metrics.jsonl").exists()


def test_killed_rank_without_restarts_fails_the_job_quickly(tmp_path: Path) -> None:
    with Job(tmp_path, "trainer.max_steps=100000") as job:
        ranks = job.wait_ranks()
        job.wait_for(lambda: _training(job))
        os.kill(ranks[1], signal.SIGKILL)
        code, seconds = job.finish(timeout=240)
    assert code == 1, job.output()[-3000:]
    assert "a rank failed" in job.output()
    print(f"killed rank: job exited {code} after {seconds:.1f} s")
    assert seconds < 120  # the peer's collective fails at once, well inside the timeout


def test_stopped_rank_fails_the_job_within_the_timeout(tmp_path: Path) -> None:
    """SIGSTOP (a hang: deadlock, stuck I/O): the other rank's collective gives up after
    launcher.timeout_s, and torch's launcher ends the stopped rank after its 30 s grace."""
    timeout_s = 15
    with Job(tmp_path, "trainer.max_steps=100000", f"launcher.timeout_s={timeout_s}") as job:
        ranks = job.wait_ranks()
        job.wait_for(lambda: _training(job))
        os.kill(ranks[1], signal.SIGSTOP)
        code, seconds = job.finish(timeout=timeout_s + 240)
        assert not any(alive(pid) for pid in ranks), "a rank outlived the failed job"
    assert code == 1, job.output()[-3000:]
    print(f"stopped rank: job exited {code} after {seconds:.1f} s (timeout {timeout_s} s)")
    assert seconds < timeout_s + 30 + 90


def test_sigterm_during_startup_ends_promptly_and_says_nothing_was_saved(tmp_path: Path) -> None:
    with Job(tmp_path, "trainer.max_steps=100000") as job:
        job.wait_ranks()  # the ranks are importing torch: startup
        os.killpg(job.proc.pid, signal.SIGTERM)  # the whole job, as a scheduler's preemption does
        code, seconds = job.finish(timeout=120)
    assert code == 143, job.output()[-3000:]
    assert "stopped without saving" in job.output() and "no checkpoint exists" in job.output()
    print(f"SIGTERM at startup: job exited {code} after {seconds:.1f} s")
    assert seconds < 60


def test_sigterm_during_a_save_completes_it_and_saves_the_stop(tmp_path: Path) -> None:
    """SIGTERM while a checkpoint is being written (a .tmp-step directory exists): the save
    completes, the ranks save the step they stop at, and the launcher exits 0."""
    with Job(
        tmp_path,
        "model=bert_mini",
        "model.vocab_size=2048",
        "trainer.max_steps=100000",
        "trainer.save_every=1",
        "trainer.keep_last=2",
    ) as job:
        root = tmp_path / "checkpoints"
        job.wait_for(lambda: any(root.glob(".tmp-step*")), poll=0.005)
        os.killpg(job.proc.pid, signal.SIGTERM)
        code, _ = job.finish(timeout=120)
    assert code == 0, job.output()[-3000:]
    assert "SIGTERM: saved step" in job.output()
    latest = store.find_latest(root)
    assert latest is not None and store.verify(latest)["step"] >= 1
    assert not list(root.glob(".tmp-step*"))


def test_killing_the_launcher_takes_its_ranks_with_it(tmp_path: Path) -> None:
    with Job(tmp_path, "trainer.max_steps=100000") as job:
        ranks = job.wait_ranks()
        job.wait_for(lambda: _training(job))
        job.proc.kill()  # SIGKILL: the launcher can forward nothing
        job.proc.wait(timeout=30)
        deadline = time.monotonic() + 30
        while any(alive(pid) for pid in ranks) and time.monotonic() < deadline:
            time.sleep(0.1)
        survivors = [pid for pid in ranks if alive(pid)]
    assert survivors == [], "ranks outlived their launcher"
