"""Trainer: the one training loop of pretraining and fine-tuning.

What differs between tasks arrives in a `TrainingTask` (train/task.py): the parallelized model,
an objective (batch -> losses normalized by global counts), the batches of each step, an
evaluator and what is kept of its results. The loop owns everything else, so each feature reaches
every task: the LR schedule, gradient accumulation, dropout keyed by (step, global sample),
checkpoints and resume (train/checkpointing.py), `exit_at_step`, SIGTERM and the time limit
(agreed by all ranks), windowed metrics, TensorBoard, the loss plot and the progress bar
(train/step_log.py).

Per step: for each micro-batch, key the dropout masks by (step, its first global sample, the
step's widest micro-batch), forward, and backward a loss normalized by the *global* counts (so
every layout optimizes the same objective); then the engine reduces, clips and updates.
"""

from __future__ import annotations

import logging
import math
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

from tpformer.config.schema import LoopConfig, OptimConfig
from tpformer.data.steps import StepInput, StepLoader, StepSource, prepare_step
from tpformer.parallel.comm import all_reduce
from tpformer.parallel.context import ParallelContext
from tpformer.parallel.control import StopAgreement, agree_any
from tpformer.parallel.regions import region
from tpformer.progress import Progress, progress
from tpformer.startup import end_start_up
from tpformer.train.callbacks import Callback, Run
from tpformer.train.checkpointing import STOP_RECORD, Checkpointer
from tpformer.train.metrics import MetricsWriter
from tpformer.train.profiling import StepProfiler
from tpformer.train.schedule import lr_at
from tpformer.train.step_log import StepLog, step_metrics
from tpformer.train.task import BestCheckpoint, StepResult, TrainingTask, UnreadStep

__all__ = ["STOP_RECORD", "BestCheckpoint", "Trainer", "TrainingTask"]

log = logging.getLogger(__name__)


class Trainer:
    def __init__(
        self,
        task: TrainingTask,
        loop: LoopConfig,
        optim: OptimConfig,
        ctx: ParallelContext,
        run_dir: Path,
    ) -> None:
        self.task, self.loop, self.optim, self.ctx, self.run_dir = task, loop, optim, ctx, run_dir
        self.model, self.engine, self.runner = task.model, task.engine, task.runner
        config = task.meta.get("config")
        self.metrics = MetricsWriter(
            run_dir,
            enabled=ctx.is_main,
            loggers=[str(logger) for logger in loop.loggers],
            plot=loop.plot,
            config=config if isinstance(config, dict) else None,
        )
        self.checkpoints = Checkpointer(task, loop, ctx, run_dir)
        self.callbacks: list[Callback] = []
        """The user's hooks (train/callbacks.py; the Python API passes them)."""
        self.run = Run(self.model, ctx, run_dir, task.max_steps)
        self._sigterm = False
        self._stops = StopAgreement(ctx)
        self.seconds: dict[str, float] = {"best_outputs": 0.0, "metrics_close": 0.0}
        """Wall time of what the run writes besides training, evaluating and checkpoints: the
        best evaluation's outputs (fine-tuning's test predictions), closing the metrics (the
        loss plot, TensorBoard). Fine-tuning's results.json reports it with the checkpoints'."""

    @property
    def evaluations(self) -> list[dict[str, float]]:
        return self.checkpoints.evaluations

    def save(self, step: int) -> Path:
        """A checkpoint of `step` into the run's checkpoints/ (tools time it)."""
        return self.checkpoints.save(step)

    def _save(self, step: int) -> Path:
        """The run's checkpoint of `step`, announced to the callbacks."""
        path = self.checkpoints.save(step)
        for callback in self.callbacks:
            callback.on_save(self.run, step, path)
        return path

    # ------------------------------------------------------------------ one step

    def queue_step(self, prepared: StepInput, *, train: bool) -> StepResult:
        """Queue forward (and backward when training) of every micro-batch of a prepared step
        without reading any device value: the counts are summed over DP on the device and
        the returned totals stay there until a log line reads them."""
        on_device = prepared.to(self.ctx.device)
        counts = all_reduce(on_device.counts, self.ctx.dp)
        totals = self.runner.run(
            prepared.step,
            on_device.parts,
            self.task.objective,
            counts[:-2],
            mask_width=prepared.mask_width,
            train=train,
        )
        # CP ranks hold the same samples (counts over DP) but each its share of every value
        values = torch.cat([all_reduce(totals, self.ctx.replicas), counts[-2:]])
        return StepResult(values, prepared.padded)

    def step_metrics(self, result: StepResult, row: list[float]) -> dict[str, float]:
        """A step's global-batch means from its values read on the host as `row`."""
        return step_metrics(self.task.objective.names, result, row)

    def run_step(self, step: int, batches: StepSource, *, train: bool) -> dict[str, float]:
        """One step prepared in line and read at once (evaluation)."""
        result = self.queue_step(prepare_step(batches, self.task.objective, step), train=train)
        return self.step_metrics(result, result.values.tolist())

    def evaluate(self, step: int) -> dict[str, float]:
        """The evaluator's metrics at `step`, logged (and kept for the best checkpoint)."""
        with self._inference():
            metrics = self.task.evaluator(self)
        record = {"step": step, **self._epoch(step), **metrics}
        self.evaluations.append(record)
        self.metrics.log({**record, "eval": True})
        for callback in self.callbacks:
            callback.on_evaluate(self.run, step, metrics)
        log.info("eval at step %d: %s", step, ", ".join(f"{k} {v:.4f}" for k, v in metrics.items()))
        nan = [k for k, v in metrics.items() if math.isnan(v)]
        if nan:
            log.warning(
                "eval at step %d: %s is NaN (e.g. a correlation of constant "
                "predictions); it counts as the worst value",
                step,
                ", ".join(nan),
            )
        best = self.task.best
        if best is not None and self.checkpoints.save_if_best(step, metrics[best.metric]):
            start = time.perf_counter()
            with self._inference():  # test predictions without dropout, as dev's
                best.on_best(step)
            self.seconds["best_outputs"] += time.perf_counter() - start
        return metrics

    @contextmanager
    def _inference(self) -> Iterator[None]:
        """The model in eval mode (no dropout), without autograd, its parameters gathered."""
        self.model.eval()
        try:
            with torch.no_grad(), self.engine.gathered():
                yield
        finally:
            self.model.train()

    def _epoch(self, step: int) -> dict[str, float]:
        per_epoch = self.task.steps_per_epoch
        return {"epoch": step / per_epoch} if per_epoch else {}

    # ------------------------------------------------------------------ stopping

    def _install_sigterm(self) -> None:
        """SIGTERM (preemption) asks for a checkpoint and a clean exit after the current step."""
        if threading.current_thread() is threading.main_thread():

            def request_stop(signum: int, frame: object) -> None:
                self._sigterm = True

            signal.signal(signal.SIGTERM, request_stop)

    # ------------------------------------------------------------------ the loop

    def train(self) -> list[dict]:
        """Run to the task's max_steps (or a stop); returns the logged training records."""
        task = self.task
        records: list[dict] = []
        started = time.perf_counter()
        steps_log = StepLog(
            task, self.loop, self.ctx, self.metrics, lambda: self.evaluations, self._epoch
        )
        self.model.train()
        self._install_sigterm()
        first = self.checkpoints.resume()
        if self._due_for_eval(first) and not any(e["step"] == first for e in self.evaluations):
            self.evaluate(first)  # stopped by SIGTERM at an evaluation step: evaluate it now
        bar = self._progress(first)
        loader = self._loader(first)
        profiler = StepProfiler(
            self.loop.profile, self.run_dir, self.ctx.rank, self.ctx.device, first
        )
        self.run.step = first
        end_start_up()  # a console script's start-up is over: full collections as usual again
        for callback in self.callbacks:
            callback.on_train_begin(self.run)
        step, reason, saved = first - 1, "done", None
        try:
            steps = iter(loader)
            for step in range(first, task.max_steps):
                lr = self._lr(step)
                self.engine.set_lr(lr)
                with region("data wait"):
                    prepared = next(steps)
                result = self.queue_step(prepared, train=True)
                host = {"lr": lr, "data_wait_s": loader.wait_s}
                steps_log.add(UnreadStep(result, self.runner.update(), host))
                last = step + 1 == task.max_steps
                preempted, timed_out = self._agree_to_stop(started)
                if last or timed_out:  # the last evaluation sees every micro-batch's update
                    self.runner.drain()
                logged = None
                if steps_log.due(step, last=last or timed_out):
                    logged = steps_log.flush(step + 1, bar)
                    records.append(logged)
                bar.update(1)
                self._step_ended(step + 1, logged)
                if not preempted and (self._due_for_eval(step + 1) or last or timed_out):
                    self.evaluate(step + 1)  # on SIGTERM the save comes first (30 s grace)
                asked = self._callback_asked_to_stop()
                reason, saved = self._stop_or_save(
                    step + 1, (preempted, timed_out, asked), last, saved
                )
                profiler.step()
                if reason != "done":
                    break
        finally:  # stop the workers (one that outlives us blocks exit) and the profiler
            loader.close()
            profiler.close()
        self._stops.settle()  # the last step's flags (after a failure nothing waits for them)
        self._finish(bar, reason, step + 1, saved)
        for callback in self.callbacks:
            callback.on_train_end(self.run, records)
        return records

    def _lr(self, step: int) -> float:
        """The step's learning rate: the schedule's, as the callbacks adjust it."""
        task = self.task
        lr = lr_at(step, peak=task.peak_lr, optim=self.optim, max_steps=task.max_steps)
        for callback in self.callbacks:
            lr = callback.lr(self.run, step, lr)
        return lr

    def _step_ended(self, step: int, logged: dict | None) -> None:
        self.run.step = step
        for callback in self.callbacks:
            callback.on_step_end(self.run, step, logged)

    def _progress(self, first: int) -> Progress:
        return progress(
            total=self.task.max_steps,
            initial=first,
            desc=self.task.description,
            unit=" steps",
            enabled=self.ctx.is_main and self.loop.progress,
            every=self.loop.log_every,
        )

    def _loader(self, first: int) -> StepLoader:
        """The coming steps' inputs, prepared ahead (data.num_workers, data.prefetch_steps)."""
        task = self.task
        return StepLoader(
            task.train_batches,
            task.objective,
            first=first,
            stop=task.max_steps,
            num_workers=task.loader.num_workers,
            prefetch_steps=task.loader.prefetch_steps,
            pin_memory=self.ctx.device.type == "cuda",
        )

    def _agree_to_stop(self, started: float) -> tuple[bool, bool]:
        """(preempted, timed out), agreed by every rank on the host one step late
        (parallel/control.py: no host waits for the slowest at every step); a failed background
        save is raised on every rank at once."""
        limit = self.loop.max_time_minutes
        over_time = limit > 0 and time.perf_counter() - started > 60 * limit
        writer = self.checkpoints.writer
        preempted, timed_out, save_failed = self._stops.exchange(
            self._sigterm, over_time, writer.failed()
        )
        if save_failed:  # every rank holds the same error
            writer.wait()
        return preempted, timed_out

    def _callback_asked_to_stop(self) -> bool:
        """Whether a callback called run.stop() in this step (its end or its evaluation), agreed
        by every rank: a second host agreement per step, made only when there are callbacks."""
        return bool(self.callbacks) and agree_any(self.ctx, self.run.stop_requested)[0]

    def _stop_or_save(
        self, step: int, stops: tuple[bool, bool, bool], last: bool, saved: Path | None
    ) -> tuple[str, Path | None]:
        """After `step`: save where due; the reason to stop now ("done": go on) and the latest
        checkpoint. `stops`: (preempted, timed out, a callback asked)."""
        loop = self.loop
        preempted, timed_out, asked = stops
        exit_at = bool(loop.exit_at_step) and step == loop.exit_at_step
        if preempted or exit_at or asked:
            saved = self._save(step)
            why = "SIGTERM" if preempted else "trainer.exit_at_step" if exit_at else "a callback"
            log.info("%s: saved step %d and stopping", why, step)
            return ("sigterm" if preempted else "exit_at_step" if exit_at else "callback"), saved
        if loop.save_every and (step % loop.save_every == 0 or last or timed_out):
            saved = self._save(step)
        if timed_out:
            log.info("trainer.max_time_minutes=%s reached at step %d", loop.max_time_minutes, step)
            return "time_limit", saved
        return "done", saved

    def _finish(self, bar: Progress, reason: str, step: int, saved: Path | None) -> None:
        """The final (or SIGTERM) save complete, the metrics closed, the stop recorded."""
        self.checkpoints.writer.close()
        bar.close()
        start_close = time.perf_counter()
        self.metrics.close()
        self.seconds["metrics_close"] = time.perf_counter() - start_close
        self.checkpoints.record_stop(reason, step, saved)

    def _due_for_eval(self, step: int) -> bool:
        every = self.task.eval_every
        return bool(every) and step > 0 and step % every == 0
