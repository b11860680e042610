"""Runs console scripts in this one process, as their console entry points do, one case per
line of a JSON list on stdin: [script, argv, cwd] or [script, argv, cwd, env]; prints [exit
code, stdout, stderr, run dirs left] per case as JSON on a last line `RESULTS [...]` (read by
`results`). One process for a whole table keeps it to a few seconds (each case in a process of
its own paid ~2.5 s of Python, torch and Hydra start-up)."""

from __future__ import annotations

import contextlib
import importlib
import io
import json
import os
import sys
from pathlib import Path


def run_case(
    script: str, argv: list[str], cwd: str, env: dict[str, str] | None = None
) -> tuple[object, str, str, list[str]]:
    """One case; `env` (a command's leading NAME=value words) is set for this case alone."""
    module, _, function = script.partition(":")
    main = getattr(importlib.import_module(module), function)
    saved = {name: os.environ.get(name) for name in env or {}}
    os.environ.update(env or {})
    os.chdir(cwd)
    sys.argv = [script, *argv]
    out, err = io.StringIO(), io.StringIO()
    code: object = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main()
        except SystemExit as exit_:
            code = exit_.code
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name)
                else:
                    os.environ[name] = value
    left = [str(p) for root in ("outputs", "multirun") for p in Path(cwd).glob(f"{root}/**/*")]
    return code, out.getvalue(), err.getvalue(), left


def results(stdout: str) -> list:
    """The per-case results from the runner's output."""
    return list(json.loads(stdout.rpartition("\nRESULTS ")[2]))


def run_cases(cases: list, env: dict[str, str] | None = None, timeout: float = 600) -> list:
    """Run the (script, argv, cwd) cases in one fresh process of this runner, with `env` over
    the environment (PYTHONPATH the repository, one thread); each case's result."""
    return run_cases_with_children(cases, env, timeout)[0]


def run_cases_with_children(
    cases: list, env: dict[str, str] | None = None, timeout: float = 600
) -> tuple[list, list[str]]:
    """run_cases, and per case what its child processes (a launcher's ranks) wrote to the
    runner's own stderr: a rank's traceback is there, not in the case's captured output."""
    from tests.cli.forked import run_script

    repo = Path(__file__).resolve().parents[2]
    done = run_script(
        "tests.cli.bad_input_cases",
        [],
        input=json.dumps(cases),
        timeout=timeout,
        cwd=repo,
        env={**os.environ, "PYTHONPATH": str(repo), "OMP_NUM_THREADS": "1", **(env or {})},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    children = done.stderr.split(CASE_MARK)[1:]
    return results(done.stdout), children + [""] * (len(cases) - len(children))


CASE_MARK = "\n== the next case's child processes ==\n"


if __name__ == "__main__":
    cases = json.loads(sys.stdin.read())
    results = []
    for case in cases:
        print(CASE_MARK, end="", file=sys.stderr, flush=True)
        results.append(run_case(*case))
    print("\nRESULTS " + json.dumps(results))  # after anything a handler wrote past the capture
