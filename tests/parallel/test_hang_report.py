"""The hang report's pieces: what the recorder keeps of each collective, and the summary line
it makes of the ranks' reports (no report, a rank behind, a mismatched collective)."""

from __future__ import annotations

import time
from pathlib import Path

import torch

from tests.dist import run_distributed
from tpformer.parallel.comm import all_reduce
from tpformer.parallel.context import ParallelContext
from tpformer.parallel.hang_report import (
    CollectiveCall,
    read_reports,
    summary,
    write_report,
)


def _two_all_reduces(ctx: ParallelContext, run_dir: str) -> list[CollectiveCall]:
    all_reduce(torch.ones(3), ctx.tp)
    all_reduce(torch.ones(2, 5), ctx.tp)  # THE_SECOND
    write_report(Path(run_dir), ctx.rank, "test", ctx.monitor.recorder)
    return list(ctx.monitor.recorder.calls)


def test_the_recorder_keeps_kind_group_shape_sequence_and_call_site(tmp_path: Path) -> None:
    line = next(
        i + 1
        for i, text in enumerate(Path(__file__).read_text().splitlines())
        if "# THE_SECOND" in text
    )
    for calls in run_distributed(_two_all_reduces, 2, str(tmp_path), tensor=2):
        last = calls[-1]
        assert (last.op, last.seq, last.ranks, last.shape) == ("all_reduce", 2, (0, 1), (2, 5))
        assert "tp" in last.group
        assert last.site == f"test_hang_report.py:{line} (_two_all_reduces)"
    reports = read_reports(tmp_path)
    assert sorted(reports) == [0, 1] and reports[1][-1].shape == (2, 5)
    assert read_reports(tmp_path, since=time.time() + 60) == {}  # an earlier hang's: ignored
    text = (tmp_path / "hang" / "rank0.txt").read_text()
    assert "most recent call first" in text and "_two_all_reduces" in text  # the stacks


def _call(seq: int, site: str, group: str = "tp", op: str = "all_reduce") -> CollectiveCall:
    return CollectiveCall(seq, op, group, (0, 1, 2, 3), (4,), site)


def test_the_summary_names_who_did_not_reach_the_collective() -> None:
    waiting = [_call(7, "loop.py:10"), _call(8, "grads.py:20")]
    reports = {
        0: waiting,
        1: waiting,
        2: [_call(7, "loop.py:10"), _call(3, "loop.py:30", group="control")],
    }  # rank 3 wrote nothing
    line = summary(reports, 4)
    assert line.startswith(
        "hang: ranks [0, 1] wait in all_reduce #8 on group tp (ranks [0, 1, 2, 3]) at "
        "grads.py:20; rank 2 did not reach it (its last collective: all_reduce #3 on group "
        "control at loop.py:30); rank 3 sent no report (stopped or killed)"
    ), line
    mismatched = {0: waiting, 1: waiting, 2: waiting, 3: [_call(8, "embedding.py:5")]}
    assert "rank 3 is in all_reduce #8 at embedding.py:5 (mismatched)" in summary(mismatched, 4)
