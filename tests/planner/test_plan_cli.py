"""tpformer-plan as a user runs it: ranked layouts for a real preset in seconds, JSON for
tools, calibration stored and used, and bad input as one line naming what fails."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from tests.cli.forked import run_script
from tests.cli.in_process import outcome, selected_cases
from tests.docs.commands import arguments, documented

REPO = Path(__file__).resolve().parents[2]


def plan(*args: str, cwd: Path | None = None, timeout: int = 120) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    return run_script("tpformer.cli.plan", args, cwd=cwd or Path.cwd(), env=env, timeout=timeout)


@pytest.mark.slow  # over 5 s (the quick tier leaves single cases that long to the full run)
def test_bert_large_on_an_h100_node_prints_ranked_layouts() -> None:
    _, argv = arguments(documented("tpformer-plan model=bert_large cluster=h100_node parallel"))
    result = plan(*argv)  # docs/planner.md's first command
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "workload: bert_large (24 layers, hidden 1024" in out
    assert "cluster h100_node: 1 node(s) x 8 devices" in out
    rows = [line for line in out.splitlines() if line.startswith(("  1 ", "  2 ", "  3 "))]
    assert len(rows) == 3, out
    assert "run #1: tpformer-pretrain model=bert_large parallel.precision=bf16 " in out
    assert "launcher.nproc_per_node=8" in out
    assert "tp 8 x pp 1:" in out  # every tensor x pipeline family is accounted for


@pytest.mark.slow  # over ~5 s: the slow tier
def test_json_ranks_fitting_layouts_by_predicted_step_time() -> None:
    _, flag = arguments(documented("tpformer-plan --json"))  # docs/planner.md: "the same"
    result = plan(
        *flag,
        "model=bert_base",
        "cluster=a100_node",
        "cluster.nodes=2",
        "plan.global_batch=256",
        "plan.top=8",
        "parallel.precision=bf16",
    )
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["cluster"]["nodes"] == 2 and data["workload"]["global_batch"] == 256
    steps = [t["step_s"] for t in data["top"]]
    assert len(steps) == 8 and data["model_error"] == 0.1
    tied = min(data["tied"], 8)  # within 10% of the fastest: simplest first, then by time
    assert all(s <= min(steps) * 1.1 for s in steps[:tied])
    assert steps[tied:] == sorted(steps[tied:]) and all(s > min(steps) * 1.1 for s in steps[tied:])
    stages = [t["layout"]["zero_stage"] for t in data["top"][:tied]]
    assert stages == sorted(stages)
    assert all(t["why"].startswith("tied") for t in data["top"][1:tied])
    for entry in data["top"]:
        layout = entry["layout"]
        assert entry["fits"] and entry["memory_bytes"]["total"] <= 80e9
        assert layout["tp"] * layout["pp"] * layout["dp"] == 16
        assert layout["micro_batch"] * layout["grad_accum"] * layout["dp"] == 256
    assert (
        data["launch"].startswith("torchrun --nnodes 2 --nproc_per_node 8")
        or "launcher.nproc_per_node" in data["launch"]
    )


BAD_INPUT = [
    (["cluster=h100_node", "cluster.gpus_per_node=-1"], "cluster.gpus_per_node=-1 must be > 0"),
    (
        ["cluster=h100_node", "cluster.matmul_efficiency=1.5"],
        "cluster.matmul_efficiency=1.5 must be a fraction in [0, 1]",
    ),
    (
        ["model=bert_tiny", "cluster=h100_node", "plan.global_batch=3"],
        "no layout can form the global batch of 3 on 8 devices: it must be divisible by a "
        "data-parallel degree in [2, 4, 8]",
    ),
    (["model=gpt2_xl", "cluster=h100_node", "cluster.device_memory_gb=1"], "needs "),
    (
        ["cluster=dgx9000"],
        "cluster=dgx9000 is not one of its options; the options: a100_node, auto, cpu, h100_node",
    ),
    (["cluster.gpus_per_nod=8"], "gpus_per_nod"),
]


@pytest.mark.sweep
@pytest.mark.parametrize(("args", "message"), BAD_INPUT)
def test_bad_input_is_one_line_with_exit_code_2(
    args: list[str], message: str, request: pytest.FixtureRequest
) -> None:
    table = [case["args"] for case in selected_cases(request)]
    result = outcome("tpformer.cli.plan:main", args, table, request)
    assert result.code == 2, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], lines


@pytest.mark.slow  # over 5 s (the quick tier leaves single cases that long to the full run)
def test_model_that_fits_no_layout_says_by_how_much() -> None:
    result = plan("model=gpt2_xl", "cluster=h100_node", "cluster.device_memory_gb=1")
    line = result.stderr.strip()
    assert "GB per rank at the smallest layout" in line and "the device has 1.0 GB" in line


@pytest.mark.slow  # over 5 s (the quick tier leaves single cases that long to the full run)
def test_calibrating_other_hardware_is_refused() -> None:
    result = plan("--calibrate", "cluster=h100_node")
    assert result.returncode == 2
    assert "--calibrate measures this machine (cpu); cluster=h100_node" in result.stderr


@pytest.mark.slow
def test_calibration_is_stored_and_used(tmp_path: Path) -> None:
    _, flag = arguments(documented("tpformer-plan --calibrate"))
    result = plan(
        *flag, "cluster=cpu", f"data.cache_dir={tmp_path}", "model=bert_mini", timeout=300
    )
    assert result.returncode == 0, result.stderr
    stored = json.loads((tmp_path / "calibration" / "cpu.json").read_text())
    assert {
        "matmul",
        "memory_gbps",
        "elementwise_passes",
        "activation_scale",
        "dropout_ns",
        "layer_overhead_us",
        "intra_node_gbps",
        "intra_node_latency_us",
    } <= set(stored)
    assert set(stored["collectives"]) == {"all_reduce", "all_gather", "reduce_scatter", "send"}
    assert all(gbps > 0 and us >= 0 for gbps, us in stored["collectives"].values())
    assert 0.9 < stored["activation_scale"] < 1.1  # one real layer vs the formula
    assert f"calibration {tmp_path / 'calibration' / 'cpu.json'}" in result.stdout
    again = plan("cluster=cpu", f"data.cache_dir={tmp_path}", "cluster.calibration=none")
    assert "preset constants" in again.stdout


@pytest.mark.slow  # README's plan enumerates 32 devices' layouts at batch 1024: ~16 s
@pytest.mark.parametrize(
    ("command", "facts"),
    [  # README's table and docs/planner.md's second command
        (
            documented("tpformer-plan model=bert_large cluster=h100_node cluster.nodes=4"),
            ["cluster h100_node: 4 node(s) x 8 devices", "global batch 1024"],
        ),
        (
            documented("tpformer-plan model=gpt2_xl cluster=a100_node"),
            ["workload: gpt2_xl (48 layers", "cluster a100_node: 16 node(s) x 8 devices"],
        ),
    ],
    ids=["readme", "planner_md"],
)
def test_the_documented_plans_print_their_cluster_and_ranked_layouts(
    command: str, facts: list[str]
) -> None:
    out = in_process(*arguments(command)[1])
    for fact in facts:
        assert fact in out, out
    assert "run #1: " in out, out


def in_process(*args: str) -> str:
    """tpformer-plan's output without a process of its own (its errors raise)."""
    from tpformer.cli.plan import _compose
    from tpformer.cli.plan import plan as run_plan

    flags = [a for a in args if a.startswith("--")]
    overrides = [a for a in args if not a.startswith("--")]
    return run_plan(
        _compose(overrides),
        overrides,
        as_json="--json" in flags,
        do_calibrate=False,
        every="--all" in flags,
    )


def test_confirmation_runs_cover_distinct_splits() -> None:
    confirm = json.loads(in_process("--json", "model=bert_large", "cluster=h100_node"))["confirm"]
    splits = {
        tuple(
            word
            for word in line.split()
            if word.startswith(("parallel.tensor=", "parallel.pipeline="))
        )
        for line in confirm
    }
    assert len(confirm) == 3 and len(splits) == 3, confirm


@pytest.mark.slow  # over 5 s (the quick tier leaves single cases that long to the full run)
def test_a_given_layout_is_priced_and_ranked() -> None:
    """Layout keys on the command line: that layout, not a search's pick (it was ignored)."""
    args = ["model=bert_large", "cluster=h100_node", "parallel.precision=bf16"]
    given = ["parallel.tensor=4", "parallel.zero_stage=1", "trainer.micro_batch_size=16"]
    out = in_process(*args, *given)
    assert "evaluated (parallel.tensor, parallel.zero_stage, trainer.micro_batch_size): " in out
    assert "tp4 pp1 dp2 z1 mb16" in out and "-> fits" in out and "rank: #" in out
    assert "run it: tpformer-pretrain" in out and "parallel.tensor=4" in out
    data = json.loads(in_process("--json", *args, *given))
    evaluated = data["evaluated"]
    assert evaluated["layout"]["tp"] == 4 and evaluated["layout"]["zero_stage"] == 1
    assert evaluated["rank"] >= 1 and evaluated["why"].startswith(("slower by", "tied"))
    assert evaluated["step_s"] >= min(t["step_s"] for t in data["top"])
    default = in_process("--json", *args, "plan.evaluate=true")
    assert json.loads(default)["evaluated"]["layout"]["tp"] == 1  # the configured defaults


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ("parallel.tensor=3", "parallel.tensor=3 does not divide world_size=8; valid values are"),
        ("parallel.tensor=32", "parallel.tensor=32 does not divide world_size=8"),
        ("parallel.sequence_parallel=true", "needs parallel.tensor > 1"),
        (
            "parallel.pipeline_replicas=[2,1]",
            "parallel.pipeline_replicas=[2, 1]: tpformer-plan prices regular",
        ),
        ("parallel.pipeline_split=pipedream", "replicated pipeline stages are chosen by"),
    ],
)
def test_a_given_layout_the_run_would_refuse_is_an_error(given: str, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        in_process("model=bert_large", "cluster=h100_node", given)


@pytest.mark.slow  # over 5 s (the quick tier leaves single cases that long to the full run)
def test_json_all_lists_every_layout_with_its_numbers_or_why_not() -> None:
    data = json.loads(
        in_process(
            "--json",
            "--all",
            "model=gpt2_medium",
            "cluster=a100_node",
            "cluster.device_memory_gb=8",
        )
    )
    entries = data["all"]
    assert len(entries) == data["searched"] > data["fit"] > 0
    misfits = [e for e in entries if not e["fits"]]
    assert len(misfits) == data["searched"] - data["fit"]
    assert all(e["why"].startswith("does not fit: ") and "step_s" not in e for e in misfits)
    assert all("step_s" in e for e in entries if e["fits"])
