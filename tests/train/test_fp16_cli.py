"""fp16 with pipeline parallelism and with ZeRO-3, each from the console script (issue 68's
seams). fp16 runs on GPUs only (the CPU's half-precision kernels are slow or missing: a CPU run
is refused with one line, tests/cli/test_bad_input.py), so the console script's dry run holds
them here: `tpformer-plan ... plan.dry_run=true` builds each layout's first rank of every stage
on the meta device over the fake backend, runs its step in fp16 with the loss scaler, and its
model state (fp16 parameters, fp32 master weights, gradients and optimizer state as the layout
shards them) must equal the planner's to the byte."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.cli.bad_input_cases import run_cases

pytestmark = pytest.mark.slow  # two console-script dry runs

PLAN = "tpformer.cli.plan:main"
COMMON = [
    "model=bert_tiny",
    "parallel.precision=fp16",
    "plan.dry_run=true",
    "cluster=h100_node",
    "cluster.gpus_per_node=2",
    "plan.global_batch=8",
    "trainer.micro_batch_size=2",
]
LAYOUTS = {
    "pipeline": (
        ["parallel.pipeline=2", "parallel.tensor=1"],
        ["rank 0 (stage 0)", "rank 1 (stage 1)"],
    ),
    "zero3": (
        ["parallel.zero_stage=3", "parallel.tensor=1", "parallel.pipeline=1"],
        ["rank 0 (stage 0)"],
    ),
}
STATE = re.compile(r"^\s+(params|grads|optimizer)\s+([\d,.]+) MB\s+planner\s+([\d,.]+) MB$", re.M)


def test_fp16_dry_runs_at_a_pipeline_and_at_zero3_hold_the_planners_model_state(
    tmp_path: Path,
) -> None:
    cases = [(PLAN, [*COMMON, *keys], str(tmp_path)) for keys, _ in LAYOUTS.values()]
    for name, (code, stdout, stderr, _) in zip(LAYOUTS, run_cases(cases), strict=True):
        assert code in (0, None), (name, stderr[-3000:])
        for rank in LAYOUTS[name][1]:
            assert rank in stdout, (name, stdout[-3000:])
        state = STATE.findall(stdout)
        assert len(state) == 3 * len(LAYOUTS[name][1]), (name, stdout[-3000:])
        for what, ran, planned in state:
            assert ran == planned, (name, what, ran, planned)
        assert re.search(r"^workload: bert_tiny .*, fp16$", stdout, re.M), (name, stdout[:500])
        assert "dry run (fake backend, meta device" in stdout, name
