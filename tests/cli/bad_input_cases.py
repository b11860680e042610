"""Runs console scripts in this one process, as their console entry points do, one case per
line of a JSON list on stdin: [script, argv, cwd]; prints [exit code, stderr, run dirs left]
per case as JSON. One process for the whole table keeps it to a few seconds."""

from __future__ import annotations

import contextlib
import importlib
import io
import json
import os
import sys
from pathlib import Path

from tpformer.cli import shell


def run_case(script: str, argv: list[str], cwd: str) -> tuple[object, str, list[str]]:
    module, _, function = script.partition(":")
    main = getattr(importlib.import_module(module), function)
    os.chdir(cwd)
    sys.argv = [script, *argv]
    shell._JobState.started = False
    err = io.StringIO()
    code: object = 0
    with contextlib.redirect_stderr(err):
        try:
            main()
        except SystemExit as exit_:
            code = exit_.code
    left = [str(p) for root in ("outputs", "multirun") for p in Path(cwd).glob(f"{root}/**/*")]
    return code, err.getvalue(), left


if __name__ == "__main__":
    cases = json.loads(sys.stdin.read())
    print(json.dumps([run_case(*case) for case in cases]))
