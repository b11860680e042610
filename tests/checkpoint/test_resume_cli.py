"""Issue 68's seam through the console script: docs/modernbert.md's run (TP=2 on 2 processes;
on synthetic data for 4 steps here) stopped at step 2 (trainer.exit_at_step) and resumed by one
process (trainer.resume=auto, the world and TP degree resharded) gives the uninterrupted
one-process run's losses (1e-5). The three
commands run in one process (tests/cli/bad_input_cases.py's runner; the first launches its
2 ranks)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.cli.bad_input_cases import run_cases
from tests.docs.commands import arguments, documented
from tests.tolerances import FP32_MODEL_REL
from tests.train.test_trainer import QUIET

PRETRAIN = "tpformer.cli.pretrain:main"
RUN = ["model=modernbert_tiny", "data=synthetic", "trainer.max_steps=4", "trainer.log_every=1",
       "trainer.progress=false", *QUIET]  # fmt: skip


def _losses(run: Path) -> dict[int, float]:
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in rows if not r.get("eval")}


@pytest.mark.slow  # three pretraining runs, one of them on 2 ranks
def test_a_modernbert_stopped_at_tp2_resumes_in_one_process_on_the_same_curve(
    tmp_path: Path,
) -> None:
    stopped, whole = tmp_path / "stopped", tmp_path / "whole"
    _, documented_run = arguments(documented("tpformer-pretrain model=modernbert_tiny model.voc"))
    model = [a for a in documented_run if not a.startswith(("parallel.", "launcher."))]
    cases = [
        [*documented_run, *RUN, "trainer.exit_at_step=2", f"hydra.run.dir={stopped}"],
        [*model, *RUN, "trainer.resume=auto", f"hydra.run.dir={stopped}"],
        [*model, *RUN, f"hydra.run.dir={whole}"],
    ]
    outcomes = run_cases([(PRETRAIN, argv, str(tmp_path)) for argv in cases])
    for code, _, stderr, _ in outcomes:
        assert code in (0, None), stderr[-3000:]
    assert "resharded {'world_size': (2, 1), 'tensor': (2, 1)}" in outcomes[1][2]
    got, want = _losses(stopped), _losses(whole)
    assert sorted(got) == sorted(want) == [1, 2, 3, 4]
    for step, loss in got.items():
        assert abs(loss - want[step]) <= FP32_MODEL_REL * abs(want[step]), (step, got, want)
