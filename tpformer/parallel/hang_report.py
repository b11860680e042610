"""Where each rank was when a run hung: the last collectives it issued, its Python stacks, and
one summary line naming the ranks that did not reach the collective the others wait in.

`parallel/comm/` records every collective it issues in its context's recorder (monitor.py: kind,
group, shape, the group's sequence number, the call site outside parallel/comm/), a small ring
buffer: a few dict and frame lookups per call, no device work. When a collective times out,
`write_report` puts that buffer and `faulthandler`'s stacks into `<run dir>/hang/rank<N>.txt`;
global rank 0 then waits briefly for the others' reports and logs `summary` (a stopped rank
writes none, and that is its answer). On NCCL, torch's own flight recorder is switched on by
`enable_nccl_flight_recorder` and dumps into the same folder.
"""

from __future__ import annotations

import faulthandler
import json
import os
import sys
import time
from collections import deque
from dataclasses import asdict, dataclass
from pathlib import Path
from types import FrameType

import torch
import torch.distributed as dist

HANG_DIR = "hang"
RING_SIZE = 64
_PLUMBING = ("parallel/comm/", "parallel/control.py", "parallel/hang_report.py")
"""Where collectives are issued on a caller's behalf: the call site is the caller's line."""


@dataclass(frozen=True)
class CollectiveCall:
    """One collective as issued by this rank: its sequence number on its group (the n-th call
    on that group), so two ranks' records of the same group can be lined up."""

    seq: int
    op: str
    group: str
    ranks: tuple[int, ...]
    shape: tuple[int, ...]
    site: str


class FlightRecorder:
    """The last RING_SIZE collectives of this process."""

    def __init__(self, size: int = RING_SIZE) -> None:
        self.calls: deque[CollectiveCall] = deque(maxlen=size)
        self._seq: dict[str, int] = {}
        self._groups: dict[int, tuple[str, tuple[int, ...]]] = {}

    def reset(self) -> None:
        self.calls.clear()
        self._seq.clear()
        self._groups.clear()

    def record(self, op: str, group: dist.ProcessGroup | None, shape: tuple[int, ...]) -> None:
        name, ranks = self._describe(group)
        seq = self._seq.get(name, 0) + 1
        self._seq[name] = seq
        self.calls.append(CollectiveCall(seq, op, name, ranks, shape, _call_site()))

    def group_name(self, group: dist.ProcessGroup | None) -> str:
        """The group's role (tp, dp, pp, ...; world) as reports call it."""
        return self._describe(group)[0]

    def name_group(self, group: dist.ProcessGroup, name: str) -> None:
        """Call the group by its role (tp, dp, pp, control) in reports; one process group in
        several roles (the world as TP and control group) gets both names."""
        ranks = tuple(dist.get_process_group_ranks(group))
        known = self._groups.get(id(group))
        label = name if known is None or known[0] == name else f"{known[0]}/{name}"
        self._groups[id(group)] = (label, ranks)

    def _describe(self, group: dist.ProcessGroup | None) -> tuple[str, tuple[int, ...]]:
        key = id(group)
        if key not in self._groups:
            if group is None or not dist.is_initialized():
                world = dist.get_world_size() if dist.is_initialized() else 1
                self._groups[key] = ("world", tuple(range(world)))
            else:
                ranks = tuple(dist.get_process_group_ranks(group))
                self._groups[key] = (str(getattr(group, "group_name", key)), ranks)
        return self._groups[key]


def _call_site() -> str:
    """file:line (function) of the nearest caller outside the plumbing modules."""
    frame: FrameType | None = sys._getframe(2)
    last = frame
    while frame is not None and any(p in frame.f_code.co_filename for p in _PLUMBING):
        last, frame = frame, frame.f_back
    frame = frame or last
    if frame is None:
        return "?"
    path = frame.f_code.co_filename
    short = path[path.find("tpformer/") :] if "tpformer/" in path else os.path.basename(path)
    return f"{short}:{frame.f_lineno} ({frame.f_code.co_name})"


def report_path(run_dir: Path, rank: int) -> Path:
    return run_dir / HANG_DIR / f"rank{rank}.txt"


def write_report(run_dir: Path, rank: int, error: str, recorder: FlightRecorder) -> Path:
    """This rank's last collectives (`recorder`'s, first line, JSON) and every thread's stack."""
    path = report_path(run_dir, rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {"rank": rank, "error": error, "calls": [asdict(c) for c in recorder.calls]}
    with path.open("w") as f:
        f.write(json.dumps(record) + "\n\n")
        f.flush()
        faulthandler.dump_traceback(f, all_threads=True)
    return path


def read_reports(run_dir: Path, since: float = 0.0) -> dict[int, list[CollectiveCall]]:
    """Every rank's recorded collectives, by global rank, from reports written at or after
    `since` (a run directory resumed after an earlier hang still holds that hang's reports)."""
    reports = {}
    for path in sorted((run_dir / HANG_DIR).glob("rank*.txt")):
        try:
            if path.stat().st_mtime < since:
                continue
            record = json.loads(path.read_text().split("\n", 1)[0])
        except (OSError, ValueError):
            continue
        calls = [
            CollectiveCall(**{**c, "ranks": tuple(c["ranks"]), "shape": tuple(c["shape"])})
            for c in record["calls"]
        ]
        reports[int(record["rank"])] = calls
    return reports


def summary(reports: dict[int, list[CollectiveCall]], world_size: int) -> str:
    """One line: the collective the reporting ranks wait in, and which of its group's ranks did
    not reach it (no report: stopped or killed; a lower sequence number: behind, at its last
    call; the same number at another call site: a mismatched collective)."""
    waiting = {rank: calls[-1] for rank, calls in reports.items() if calls}
    if not waiting:
        silent = sorted(set(range(world_size)) - set(reports))
        return f"hang: no collective recorded; ranks without a report: {silent}"
    by_call: dict[tuple[str, int, str, str], list[int]] = {}
    for rank, call in sorted(waiting.items()):
        by_call.setdefault((call.group, call.seq, call.op, call.site), []).append(rank)
    # the collective most reporting ranks wait in (ties: the one the lowest rank waits in)
    waiters = max(by_call.values(), key=lambda ranks: (len(ranks), -ranks[0]))
    target = waiting[waiters[0]]
    parts = []
    for rank in target.ranks:
        if rank in waiters:
            continue
        calls = reports.get(rank)
        if calls is None:
            parts.append(f"rank {rank} sent no report (stopped or killed)")
            continue
        same = [c for c in calls if c.group == target.group]
        last = same[-1] if same else None
        if last is None or last.seq < target.seq:
            now = calls[-1] if calls else None
            at = f"{now.op} #{now.seq} on group {now.group} at {now.site}" if now else "none"
            parts.append(f"rank {rank} did not reach it (its last collective: {at})")
        elif last.site != target.site or last.op != target.op:
            parts.append(f"rank {rank} is in {last.op} #{last.seq} at {last.site} (mismatched)")
    behind = "; ".join(parts) or "every rank of its group reached it"
    return (
        f"hang: ranks {waiters} wait in {target.op} #{target.seq} on group {target.group} "
        f"(ranks {list(target.ranks)}) at {target.site}; {behind}"
    )


def gather_summary(run_dir: Path, world_size: int, since: float, wait_s: float = 10.0) -> str:
    """The summary once every rank has reported (since `since`), or after `wait_s` with those
    that did."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        if len(read_reports(run_dir, since)) >= world_size:
            break
        time.sleep(0.2)
    return summary(read_reports(run_dir, since), world_size)


def enable_nccl_flight_recorder(run_dir: Path) -> None:
    """torch's NCCL flight recorder, dumped on a watchdog timeout into <run dir>/hang (set
    before the process group exists, on CUDA machines only; a user's own settings win)."""
    if not torch.cuda.is_available():
        return
    (run_dir / HANG_DIR).mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("TORCH_NCCL_TRACE_BUFFER_SIZE", "2000")
    os.environ.setdefault("TORCH_NCCL_DUMP_ON_TIMEOUT", "1")
    prefix = str(run_dir / HANG_DIR / "nccl_trace_rank_")
    os.environ.setdefault("TORCH_NCCL_DEBUG_INFO_TEMP_FILE", prefix)
    os.environ.setdefault("TORCH_FR_DUMP_TEMP_FILE", prefix)
