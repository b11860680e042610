"""trainer.profile: a torch.profiler trace of a window of steps on chosen ranks, written per
rank into <run dir>/profile/ (Chrome trace JSON: TensorBoard's profiler plugin and Perfetto
read it), with tpformer's own regions labelled (parallel/regions.py: forward and backward per
micro-batch, the optimizer, each collective and its group, each pipeline action, the data
wait), and on CUDA a memory snapshot of the window."""

from __future__ import annotations

import logging
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, schedule

from tpformer.config.schema import ProfileConfig

log = logging.getLogger(__name__)
PROFILE_DIR = "profile"


class StepProfiler:
    """Starts at construction; call step() after every training step and close() at the end.
    The window is `start` .. start + steps - 1 in the loop's step numbers (1 = the first
    step), so it holds across a resume."""

    def __init__(
        self, config: ProfileConfig, run_dir: Path, rank: int, device: torch.device, first: int
    ) -> None:
        start, steps, warmup, ranks = config.start, config.steps, config.warmup, config.ranks
        self.rank, self.out = rank, run_dir / PROFILE_DIR
        traced = start > 0 and (not ranks or rank in ranks)
        skip = start - 1 - first - warmup  # steps before the warm-up begins
        self.active = traced and skip >= 0
        self.snapshot = config.memory and device.type == "cuda"
        self._profiler: profile | None = None
        if traced and not self.active:
            log.warning(
                "trainer.profile.start=%d: the run starts at step %d, after the window's "
                "warm-up begins; no trace is written",
                start,
                first + 1,
            )
        if self.active:
            activities = [ProfilerActivity.CPU]
            if device.type == "cuda":
                activities.append(ProfilerActivity.CUDA)
            self._profiler = profile(
                activities=activities,
                schedule=schedule(skip_first=skip, wait=0, warmup=warmup, active=steps, repeat=1),
                on_trace_ready=self._write,
                profile_memory=self.snapshot,
                record_shapes=False,
            )
            self.out.mkdir(parents=True, exist_ok=True)
            if self.snapshot:
                torch.cuda.memory._record_memory_history(max_entries=200_000)
            self._profiler.start()

    def step(self) -> None:
        if self._profiler is not None:
            self._profiler.step()

    def _write(self, prof: profile) -> None:
        trace = self.out / f"rank{self.rank}.pt.trace.json"
        prof.export_chrome_trace(str(trace))
        if self.snapshot:
            torch.cuda.memory._dump_snapshot(str(self.out / f"rank{self.rank}_memory.pickle"))
            torch.cuda.memory._record_memory_history(enabled=None)
        log.info("trainer.profile: wrote %s", trace)

    def close(self) -> None:
        """Stop profiling (a window cut short by the run's end is written as it stands)."""
        if self._profiler is not None:
            self._profiler.stop()
            self._profiler = None
