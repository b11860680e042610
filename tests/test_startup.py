"""tpformer/startup.py: a console script (or a rank torchrun starts with `-m tpformer.cli...`)
defers full garbage collections through its imports, and training begins with the collector's
own thresholds back and start-up's objects frozen; any other process keeps its collector as it
was."""

from __future__ import annotations

import gc
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.train.test_trainer import REPO, tiny_config
from tpformer import startup
from tpformer.parallel.context import ParallelContext
from tpformer.train.pretraining import pretraining_trainer


@pytest.fixture
def collector() -> Iterator[tuple[int, int, int]]:
    """The test process's thresholds, restored (and nothing left frozen) whatever the test did."""
    before = gc.get_threshold()
    yield before
    startup._deferred = None
    gc.set_threshold(*before)
    gc.unfreeze()


@pytest.mark.parametrize(
    ("argv0", "orig_argv", "console"),
    [
        ("/usr/local/bin/tpformer-pretrain", ["python", "/usr/local/bin/tpformer-pretrain"], True),
        ("-m", ["python", "-u", "-m", "tpformer.cli.pretrain", "model=bert_mini"], True),
        ("/usr/bin/pytest", ["python", "-m", "pytest", "tests"], False),
        ("-c", ["python", "-c", "import tpformer.cli"], False),
    ],
)
def test_console_scripts_and_their_ranks_are_recognized(
    monkeypatch: pytest.MonkeyPatch, argv0: str, orig_argv: list[str], console: bool
) -> None:
    monkeypatch.setattr(sys, "argv", [argv0])
    monkeypatch.setattr(sys, "orig_argv", orig_argv)
    assert startup.is_console_script() is console


def test_a_console_script_defers_full_collections_from_its_first_import() -> None:
    """In a fresh interpreter named as a console script, importing the package tpformer.cli
    (what every entry point imports first, before torch) defers them; a plain import does not."""
    probe = "import sys; {name}import tpformer.cli, gc; print(gc.get_threshold())"
    named = "sys.argv[0] = '/usr/local/bin/tpformer-plan'; "
    outputs = [
        subprocess.run(
            [sys.executable, "-c", probe.format(name=name)],
            cwd=REPO,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.split()
        for name in (named, "")
    ]
    default = [str(n) for n in gc.get_threshold()]
    assert outputs[0][-1] == f"{startup.FULL_COLLECTIONS_EVERY})"
    assert " ".join(outputs[0][:2]) == " ".join(outputs[1][:2])  # young generations unchanged
    assert "".join(outputs[1]) == f"({','.join(default)})"


def test_training_begins_with_the_collectors_own_thresholds(
    tmp_path: Path, collector: tuple[int, int, int]
) -> None:
    startup.defer_full_collections()
    assert gc.get_threshold() == (*collector[:2], startup.FULL_COLLECTIONS_EVERY)
    frozen = gc.get_freeze_count()
    pretraining_trainer(
        tiny_config(steps=1), ParallelContext.single(device="cpu"), tmp_path
    ).train()
    assert gc.get_threshold() == collector
    assert gc.get_freeze_count() > frozen  # start-up's objects: out of later full collections


def test_a_process_that_did_not_defer_keeps_its_collector(collector: tuple[int, int, int]) -> None:
    frozen = gc.get_freeze_count()
    startup.end_start_up()
    assert gc.get_threshold() == collector
    assert gc.get_freeze_count() == frozen
