"""Windowed logging of training steps: the steps of a window stay on the device until its log
line, which reads them in one transfer and writes one metrics.jsonl record (the window's mean
losses and metrics, LR, throughput, MFU, the slowest rank's own time) and the progress bar.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from tpformer.config.schema import LoopConfig
from tpformer.models.costs import step_flops
from tpformer.parallel.comm import all_gather_object
from tpformer.parallel.context import ParallelContext
from tpformer.progress import Progress
from tpformer.train.metrics import MetricsWriter, RankTimes, peak_tflops
from tpformer.train.task import StepResult, TrainingTask, UnreadStep

HOST_KEYS = ("tokens", "lr", "grad_norm", "skipped", "data_wait_s")
"""Per-step values that are not averaged as metrics over a window."""


def step_metrics(names: tuple[str, ...], result: StepResult, row: list[float]) -> dict[str, float]:
    """A step's global-batch means, token count and (padded batches) padding share, from
    `result.values` read on the host as `row`."""
    tokens, real = row[len(names)], row[len(names) + 1]
    padded = {"pad_fraction": 1.0 - real / tokens} if result.padded else {}
    return {**dict(zip(names, row, strict=False)), "tokens": tokens, **padded}


class StepLog:
    """The window of unread steps and the log line that reads it."""

    def __init__(
        self,
        task: TrainingTask,
        loop: LoopConfig,
        ctx: ParallelContext,
        metrics: MetricsWriter,
        evaluations: Callable[[], list[dict[str, float]]],
        epoch: Callable[[int], dict[str, float]],
    ) -> None:
        self.task, self.loop, self.ctx, self.metrics = task, loop, ctx, metrics
        self.evaluations, self.epoch = evaluations, epoch
        dtype = "fp32" if task.engine.dtype == torch.float32 else "bf16"
        self.peak = peak_tflops(loop.peak_tflops, dtype)
        self.window: list[UnreadStep] = []
        self.last = self.own_since = time.perf_counter()
        ctx.monitor.clock.take()  # waits count from here

    def add(self, step: UnreadStep) -> None:
        self.window.append(step)

    def due(self, step: int, *, last: bool) -> bool:
        """Whether step (0-based) ends a window: every trainer.log_every, the first, the last."""
        return (step + 1) % self.loop.log_every == 0 or last or step == 0

    def flush(self, step: int, bar: Progress) -> dict:
        """Read the window (the device has run its steps), log its line; the record."""
        now = time.perf_counter()
        step_time = (now - self.last) / len(self.window)
        values = self._read()
        taken = time.perf_counter()
        own = (taken - self.own_since - self.ctx.monitor.clock.take()) / len(self.window)
        self.own_since = taken
        ranks = RankTimes(all_gather_object(own, self.ctx.control))  # host floats, gloo
        record = self._record(step, values, step_time, ranks)
        self.metrics.log(record)
        bar.set_postfix(refresh=True, **self._shown(record, ranks))
        self.window, self.last = [], now
        return record

    def _read(self) -> list[dict[str, float]]:
        """The window's device values, read on the host in one transfer."""
        names = list(self.window[0].engine)
        rows = torch.stack(
            [
                torch.cat([p.result.values, *(p.engine[k].reshape(1) for k in names)])
                for p in self.window
            ]
        ).tolist()
        self.task.engine.check_finite()
        objective = self.task.objective.names
        return [
            {
                **step_metrics(objective, p.result, row[: -len(names)]),
                **dict(zip(names, row[-len(names) :], strict=True)),
                **p.host,
            }
            for p, row in zip(self.window, rows, strict=True)
        ]

    def _record(
        self, step: int, window: list[dict[str, float]], step_time: float, ranks: RankTimes
    ) -> dict:
        """One metrics.jsonl line: the window's mean losses and metrics, LR, throughput, MFU,
        and (several ranks) the slowest rank's own step time."""
        names = [k for k in window[0] if k not in HOST_KEYS]
        tokens = sum(w["tokens"] for w in window) / len(window)
        samples = self.task.global_batch
        flops = step_flops(
            self.task.model_config,
            samples=samples,
            seq=max(1, round(tokens / samples)),
            head_tokens=int(tokens * self.task.objective.head_fraction),
            task=self.task.meta["task"],
            num_labels=int(self.task.meta.get("num_labels", 2)),
        )
        tflops = flops / step_time / 1e12 / self.ctx.layout.world_size
        last = window[-1]
        record = {
            "step": step,
            **self.epoch(step),
            **{k: sum(w[k] for w in window) / len(window) for k in names},
            "lr": last["lr"],
            "grad_norm": last["grad_norm"],
            "skipped": last["skipped"],
            "data_wait_s": sum(w["data_wait_s"] for w in window) / len(window),
            "tokens_per_s": tokens / step_time,
            "tflops_per_device": tflops,
        }
        if self.peak > 0:
            record["mfu"] = tflops / self.peak
        if len(ranks.seconds) > 1:
            record.update(ranks.metrics())
        return record

    def _shown(self, record: dict, ranks: RankTimes) -> dict[str, str]:
        """The progress bar's postfix of a log line."""
        shown = {
            "loss": f"{record['loss']:.3f}",
            "lr": f"{record['lr']:.2e}",
            "tok_s": f"{record['tokens_per_s']:.0f}",
            "tflops": f"{record['tflops_per_device']:.3f}",
            "wait": f"{record['data_wait_s']:.3f}s",
        }
        if self.peak > 0:
            shown["mfu"] = f"{record['mfu']:.1%}"
        if ranks.lag() > self.loop.straggler_threshold:
            shown["slowest"] = f"rank {ranks.slowest} +{ranks.lag():.0%}"
        evaluations = self.evaluations()
        if evaluations:  # the latest evaluation's first metric (eval loss or dev metric)
            name = next(k for k in evaluations[-1] if k not in ("step", "epoch"))
            shown[f"eval_{name}"] = f"{evaluations[-1][name]:.4f}"
        return shown
