"""`python -m tpformer.cli.<script> ARGS` as a test runs it, without paying the interpreter's
start-up each time: the script runs in a process forked from the suite's forkserver
(tests/dist.py: torch, dynamo, transformers, Hydra and the console scripts already imported),
with its own working directory, environment, argv, standard streams and exit code, as a
subprocess has them. Its ranks (`launcher.nproc_per_node=N`) are forked from it in turn by
torch's launcher (tpformer/cli/forked_ranks.py).

What a process of its own would add is the interpreter's start-up and the imports; the tests
that run console scripts as real subprocesses (tests/cli/test_shell.py, tests/faults/, the
wheel check in .ci/wheel_check, tests/test_startup.py) keep those in view. An environment that
changes what a library reads once, at import (HF_*, TRANSFORMERS_*, TORCH*, ...), runs as a
real subprocess: the forkserver imported those libraries under the suite's own environment."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from tests.dist import forkserver_context
from tpformer.cli.forked_ranks import as_a_fresh_process, run_module_as_main

ENV_READ_AT_RUN_TIME = frozenset({"PYTHONPATH", "OMP_NUM_THREADS", "COLUMNS"})
"""Variables that may differ from the suite's own: read when the script runs, not at import."""


def run_script(
    module: str,
    args: Sequence[str],
    *,
    cwd: Path | str,
    env: Mapping[str, str] | None = None,
    timeout: float = 300,
    input: str = "",
) -> subprocess.CompletedProcess[str]:
    """`python -m module *args` in `cwd` with `env` (default: this process's), its output
    captured as text, as `subprocess.run(..., capture_output=True, text=True)` returns it;
    subprocess.TimeoutExpired after `timeout` seconds (the script and its ranks killed)."""
    env = dict(os.environ if env is None else env)
    argv = [sys.executable, "-m", module, *args]
    if _read_at_import(env):
        return subprocess.run(
            argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, input=input
        )
    with tempfile.TemporaryDirectory(prefix="tpformer-script-") as folder:
        out, err, given = (Path(folder) / name for name in ("stdout", "stderr", "stdin"))
        given.write_text(input)
        out.touch()
        err.touch()
        streams = (str(given), str(out), str(err))
        process = forkserver_context().Process(
            target=_script_main, args=(module, list(args), str(cwd), env, streams)
        )
        process.start()
        process.join(timeout)
        if process.exitcode is None:
            _kill_session(process.pid)
            process.join()
            raise subprocess.TimeoutExpired(argv, timeout, _text(out), _text(err))
        return subprocess.CompletedProcess(argv, process.exitcode, _text(out), _text(err))


def _text(path: Path) -> str:
    return path.read_text(errors="replace")


def _read_at_import(env: Mapping[str, str]) -> bool:
    """Whether `env` differs from this process's in a variable some library reads at import."""
    names = set(env) | set(os.environ)
    return any(env.get(name) != os.environ.get(name) for name in names - ENV_READ_AT_RUN_TIME)


def _kill_session(pid: int) -> None:
    """The script, and its ranks with it (a rank dies with its launcher: PR_SET_PDEATHSIG)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)


def _script_main(
    module: str, args: list[str], cwd: str, env: dict[str, str], streams: tuple[str, str, str]
) -> None:
    """In the forked process: the subprocess's session, directory, environment and standard
    streams; then the module as `python -m` runs it. Its exit code is the script's."""
    os.setsid()  # one group with the ranks it forks: a timeout kills them all
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    for fd, path in enumerate(streams):
        opened = os.open(path, os.O_RDONLY if fd == 0 else os.O_WRONLY | os.O_TRUNC)
        os.dup2(opened, fd)
        os.close(opened)
    sys.stdin = open(0, encoding="utf-8", closefd=False)  # noqa: SIM115 (the process's own)
    as_a_fresh_process()
    run_module_as_main(module, args)


def convert(*args: str) -> None:
    """`tpformer-convert *args`, which must succeed (its stderr in the failure)."""
    done = run_script("tpformer.cli.convert", args, cwd=Path.cwd())
    assert done.returncode == 0, done.stderr[-3000:]
