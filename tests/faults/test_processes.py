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
        # on the CPU the ranks are forked from the launcher (cli/forked_ranks.py), each in a
        # session of its own: the launcher's command line, not `python -u -m ...` of their own
        launcher = Path(f"/proc/{job.proc.pid}/cmdline").read_bytes()
        assert all(Path(f"/proc/{r}/cmdline").read_bytes() == launcher for r in ranks)
        assert all(os.getsid(r) == r for r in ranks), "a forked rank shares the launcher's session"
        os.kill(ranks[1], signal.SIGKILL)
        code, seconds = job.finish(timeout=240)
    assert code == 1, job.output()[-3000:]
    errors = [line for line in job.output().splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "rank 1 was killed by SIGKILL" in errors[0], job.output()
    # the peer whose collective broke says so in one line and exits after the killed rank, so
    # the launcher names the cause (CI once saw "rank 0 exited with code 1" alone: shell.py)
    assert "rank 0 lost its connection to another rank" in job.output(), job.output()
    assert "Traceback" not in job.output(), job.output()
    print(f"killed rank: job exited {code} after {seconds:.1f} s")
    assert seconds < 120  # the peer's collective fails at once, well inside the timeout


def test_stopped_rank_fails_the_job_within_the_timeout(tmp_path: Path) -> None:
    """SIGSTOP (a hang: deadlock, stuck I/O): the other rank's collective gives up after
    launcher.timeout_s, and torch's launcher ends the stopped rank after its 30 s grace (its
    failure path takes no TORCH_ELASTIC_SHUTDOWN_TIMEOUT)."""
    timeout_s = 10
    with Job(tmp_path, "trainer.max_steps=100000", f"launcher.timeout_s={timeout_s}") as job:
        ranks = job.wait_ranks()
        job.wait_for(lambda: _training(job))
        os.kill(ranks[1], signal.SIGSTOP)
        code, seconds = job.finish(timeout=timeout_s + 240)
        assert not any(alive(pid) for pid in ranks), "a rank outlived the failed job"
    assert code == 1, job.output()[-3000:]
    print(f"stopped rank: job exited {code} after {seconds:.1f} s (timeout {timeout_s} s)")
    assert seconds < timeout_s + 30 + 90
    # the hang report: rank 0's collectives and stacks, and one line naming the stopped rank
    report = (tmp_path / "hang" / "rank0.txt").read_text()
    assert '"calls": [{' in report and "most recent call first" in report
    summary = [line for line in job.output().splitlines() if "hang: ranks [0] wait in" in line]
    assert summary and "rank 1 sent no report (stopped or killed)" in summary[0], job.output()
    assert " at tpformer/" in summary[0]  # the call site of the collective rank 0 waits in


def test_a_skipped_collective_is_named_with_its_call_site(tmp_path: Path) -> None:
    """tests/faults/skipped_collective.py: rank 1 skips a TP all-reduce and waits in the next
    collective of another group; both time out, and rank 0's summary names rank 1 and where
    each rank waits."""
    import subprocess
    import sys

    from tests.train.test_trainer import REPO

    program = REPO / "tests" / "faults" / "skipped_collective.py"
    skipped = next(
        i + 1 for i, line in enumerate(program.read_text().splitlines()) if "SKIPPED_LINE" in line
    )
    timeout_s = 8
    start = time.monotonic()
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node=2",
            str(program),
            str(tmp_path),
            str(timeout_s),
        ],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=timeout_s + 120,
    )
    seconds = time.monotonic() - start
    assert result.returncode != 0
    summary = [line for line in result.stderr.splitlines() if line.startswith("hang: ")]
    assert summary, result.stderr[-3000:]
    assert summary[0].startswith(
        f"hang: ranks [0] wait in all_reduce #2 on group tp/control (ranks [0, 1]) at "
        f"skipped_collective.py:{skipped} (main); rank 1 did not reach it (its last "
        f"collective: all_reduce #2 on group second at skipped_collective.py:{skipped + 1} (main))"
    ), summary[0]
    assert sorted(p.name for p in (tmp_path / "hang").glob("rank*.txt")) == [
        "rank0.txt",
        "rank1.txt",
    ]
    print(f"skipped collective: summary after {seconds:.1f} s (timeout {timeout_s} s)")
    assert seconds < timeout_s + 60


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
