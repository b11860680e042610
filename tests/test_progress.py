"""Progress off a terminal: plain log lines at most every `every` steps (or every 30 s), never a
bar's redraws; a redirected preprocessing run writes a small, readable log."""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.data.common import write_corpus
from tpformer.progress import LogProgress

REPO = Path(__file__).resolve().parents[1]


class FakeClock:
    def __init__(self, step_s: float) -> None:
        self.now, self.step_s = 0.0, step_s

    def __call__(self) -> float:
        self.now += self.step_s
        return self.now


def test_training_display_logs_once_per_interval_of_steps(caplog: pytest.LogCaptureFixture) -> None:
    bar = LogProgress(
        desc="pretrain", unit=" steps", total=100, initial=0, every=10, clock=FakeClock(0.5)
    )
    with caplog.at_level(logging.INFO, logger="tpformer.progress"):
        for step in range(100):
            bar.set_postfix(loss=f"{5 - step / 50:.3f}")
            bar.update(1)
        bar.close()
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 10
    assert lines[0].startswith("pretrain: 10/100 steps, ") and "ETA" in lines[0]
    assert lines[-1].startswith("pretrain: 100/100 steps") and lines[-1].endswith("loss=3.020")


def test_other_displays_log_every_interval(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="tpformer.progress"):
        for _ in LogProgress(
            range(1000), desc="preprocess", unit=" docs", interval_s=30, clock=FakeClock(0.1)
        ):
            pass
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 4  # at 30, 60 and 90 s, and the last document at close
    assert lines[-1].startswith("preprocess: 1,000 docs, ")


@pytest.mark.slow
def test_redirected_preprocessing_writes_a_small_readable_log(tmp_path: Path) -> None:
    corpus = write_corpus(tmp_path / "c.txt", documents=3000, sentences=3)
    log_path = tmp_path / "preprocess.log"
    args = [
        sys.executable,
        "-c",
        "from tpformer.cli.data import preprocess_main; preprocess_main()",
        "data=text",
        f"data.paths=[{corpus}]",
        "model.vocab_size=150",
        f"data.cache_dir={tmp_path / 'cache'}",
        "data.workers=2",
    ]
    with log_path.open("w") as out:  # not a terminal, as under SLURM or nohup
        result = subprocess.run(
            args,
            stdout=out,
            stderr=subprocess.STDOUT,
            timeout=300,
            env={**os.environ, "PYTHONPATH": str(REPO)},
            cwd=tmp_path,
        )
    text = log_path.read_text()
    assert result.returncode == 0, text[-2000:]
    assert "\r" not in text and "\x1b" not in text
    assert len(text) < 4000, text[-2000:]
    assert re.search(r"preprocess: ([\d,]+)/\1 kB, ", text), text  # bytes read, of all
    assert "tokens_s=" in text and "MB_s=" in text
