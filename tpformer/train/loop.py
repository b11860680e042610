"""Trainer: the one training loop of pretraining and fine-tuning.

What differs between tasks arrives in a `TrainingTask`: the parallelized model, an objective
(batch -> losses normalized by global counts), the batches of each step, an evaluator and
what is kept of its results. The loop owns everything else, so each feature reaches every task:
the LR schedule, gradient accumulation, dropout keyed by (step, global sample), periodic and
final checkpoints, resume (`trainer.resume`), `exit_at_step`, SIGTERM and the time limit (agreed
by all ranks), metrics.jsonl, TensorBoard, the loss plot and the progress bar.

Per step: for each micro-batch, key the dropout masks by (step, its first global sample, the
step's widest micro-batch), forward, and backward a loss normalized by the *global* counts (so
every layout optimizes the same objective); then the engine reduces, clips and updates.
"""

from __future__ import annotations

import json
import logging
import math
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import Tensor, nn

from tpformer.checkpoint import store
from tpformer.checkpoint.writer import CheckpointWriter
from tpformer.config.schema import LoaderConfig, LoopConfig, ModelConfig, OptimConfig
from tpformer.data.steps import StepInput, StepLoader, StepSource, prepare_step
from tpformer.engine import ZeroEngine
from tpformer.engine.step_runner import StepRunner
from tpformer.parallel.comm import all_gather_object, all_reduce
from tpformer.parallel.context import ParallelContext
from tpformer.parallel.control import agree_any
from tpformer.parallel.wait_clock import WAIT_CLOCK
from tpformer.planner.step_time import flops_per_step
from tpformer.progress import Progress, progress
from tpformer.train.metrics import MetricsWriter, RankTimes, peak_tflops
from tpformer.train.objectives import Objective
from tpformer.train.schedule import lr_at

log = logging.getLogger(__name__)

STOP_RECORD = "stop.json"
"""Written by rank 0 into the run directory when training ends: why, at which step, and the
checkpoint saved then (or null). The launcher reads it after a preemption."""


@dataclass
class StepResult:
    """A queued step's device values: float64 [objective names..., tokens, real tokens]."""

    values: Tensor
    padded: bool
    """The batches carry an attention mask (the padding share is reported)."""


@dataclass
class UnreadStep:
    """A trained step not yet logged: its device values and what the host knows already."""

    result: StepResult
    engine: dict[str, Tensor]
    """The engine's grad_norm and skipped (device scalars)."""
    host: dict[str, float]
    """The LR and the seconds spent waiting for the data."""


class Evaluator(Protocol):
    """Runs with the model in eval mode and every parameter gathered; returns its metrics."""

    def __call__(self, trainer: Trainer) -> dict[str, float]: ...


@dataclass
class BestCheckpoint:
    """Fine-tuning: keep the checkpoint of the best evaluation in <run dir>/best."""

    metric: str
    """The evaluator's metric that decides (higher is better)."""
    on_best: Callable[[int], None] = lambda step: None
    """Called on every rank after a new best was saved, the model in eval mode with its
    parameters gathered (e.g. write test predictions)."""


@dataclass
class TrainingTask:
    """Everything the loop needs that differs between pretraining and fine-tuning."""

    model: nn.Module
    engine: ZeroEngine
    runner: StepRunner
    """The micro-batch loop of a step at this layout (Parallelized.runner)."""
    objective: Objective
    train_batches: StepSource
    evaluator: Evaluator
    max_steps: int
    global_batch: int
    peak_lr: float
    model_config: ModelConfig
    meta: dict[str, Any]
    """What checkpoints record beside the step (store.checkpoint_meta)."""
    eval_every: int = 0
    """Evaluate every N steps (0: only at the end); always at the end."""
    steps_per_epoch: int = 0
    """Logged as `epoch` when set (fine-tuning)."""
    best: BestCheckpoint | None = None
    tokenizer_files: list[Path] = field(default_factory=list)
    description: str = "train"
    loader: LoaderConfig = field(default_factory=LoaderConfig)
    """How the coming steps' batches are built (the task's data config)."""


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
            config=config if isinstance(config, dict) else None,
        )
        self.writer = CheckpointWriter(ctx, background=loop.async_save)
        self.evaluations: list[dict[str, float]] = []
        self.best_value = -math.inf
        self._sigterm = False
        self.seconds: dict[str, float] = {
            "checkpoints": 0.0,
            "best_outputs": 0.0,
            "metrics_close": 0.0,
        }
        """Wall time of what the run writes besides training and evaluating: checkpoints, the
        best evaluation's outputs (fine-tuning's test predictions), closing the metrics (the
        loss plot, TensorBoard). Fine-tuning's results.json reports it."""

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
        padded = bool(prepared.parts) and "attention_mask" in prepared.parts[0][1]
        return StepResult(values, padded)

    def step_metrics(self, result: StepResult, row: list[float]) -> dict[str, float]:
        """A step's global-batch means, token count and (padded batches) padding share, from
        `result.values` read on the host as `row`."""
        names = self.task.objective.names
        tokens, real = row[len(names)], row[len(names) + 1]
        padded = {"pad_fraction": 1.0 - real / tokens} if result.padded else {}
        return {**dict(zip(names, row)), "tokens": tokens, **padded}

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
        if best is not None:
            value = metrics[best.metric]
            value = -math.inf if math.isnan(value) else value
            if value > self.best_value or not self.evaluations[:-1]:  # the first is kept anyway
                self.best_value = max(value, self.best_value)
                self.save(step, root=self.run_dir / "best", keep_last=1, weights_only=True)
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

    # ------------------------------------------------------------------ checkpoints

    @property
    def checkpoint_root(self) -> Path:
        return self.run_dir / "checkpoints"

    def save(
        self,
        step: int,
        *,
        root: Path | None = None,
        keep_last: int | None = None,
        weights_only: bool = False,
    ) -> Path:
        """The engine's logical state, this rank's RNG and the loop's own state, written by the
        ranks together through DCP (in the background with trainer.async_save: this returns
        once the state is copied to host memory); `weights_only` (the best checkpoint, for
        export and predictions): the parameters alone."""
        start = time.perf_counter()
        if not weights_only:  # a checkpoint holds no micro-batch in flight (pipedream)
            self.runner.drain()
        state: dict[str, Any] = (
            {"engine": self.engine.weights_state_dict()}
            if weights_only
            else {
                "engine": self.engine.state_dict(saving=True),
                f"rng_rank{self.ctx.rank}": store.rng_state(),
            }
        )
        trainer_state = {
            "evaluations": self.evaluations,
            "best_value": self.best_value,
            "global_batch": self.task.global_batch,
        }
        meta = {
            **self.task.meta,
            "trainer": trainer_state,
            **({"weights_only": True} if weights_only else {}),
        }
        saved = self.writer.save(
            root or self.checkpoint_root,
            step,
            state,
            meta=meta,
            keep_last=self.loop.keep_last if keep_last is None else keep_last,
            tokenizer_files=self.task.tokenizer_files,
        )
        self.seconds["checkpoints"] += time.perf_counter() - start
        return saved

    def resume(self) -> int:
        """Load trainer.resume at this run's layout; returns the step to continue from."""
        choice = self.loop.resume
        if choice == "none":
            return 0
        directory = store.choose_checkpoint(
            self.checkpoint_root,
            None if choice == "auto" else Path(choice),
            self.ctx,
            check=self.loop.verify_checkpoint,
        )
        if directory is None:
            log.info(
                "trainer.resume=auto: no intact checkpoint in %s, starting at step 0",
                self.checkpoint_root,
            )
            return 0
        meta = store.read_meta(directory)
        if meta.get("weights_only"):
            raise store.CheckpointError(
                f"{directory} holds the weights only (a fine-tuning run's best checkpoint, for "
                f"export and predictions), no optimizer state to resume; resume from a "
                f"checkpoint that trainer.save_every wrote into {self.checkpoint_root}"
            )
        mismatched = store.model_mismatches(meta, self.task.model_config)
        if mismatched:
            details = ", ".join(
                f"{k}: checkpoint {a} vs run {b}" for k, (a, b) in mismatched.items()
            )
            raise ValueError(f"{directory} holds another model ({details})")
        rng_key = f"rng_rank{self.ctx.rank}"
        same_world = (  # per-rank RNG states only mean something for the same ranks
            meta.get("world_size") == self.ctx.layout.world_size
            and rng_key in store.saved_keys(directory)  # none in an imported checkpoint
        )
        template: dict[str, Any] = {"engine": self.engine}
        if same_world:
            template[f"rng_rank{self.ctx.rank}"] = store.rng_state()
        store.load(directory, template)
        if same_world:
            torch.set_rng_state(template[f"rng_rank{self.ctx.rank}"]["cpu"])
        state = meta.get("trainer", {})
        saved_batch = state.get("global_batch", self.task.global_batch)
        if saved_batch != self.task.global_batch:
            log.warning(
                "the checkpoint trained with a global batch of %d samples per step, this run "
                "with %d: the steps from here train on other samples than the run that wrote "
                "it (set trainer.global_batch_size=%d to continue its curve on this world)",
                saved_batch,
                self.task.global_batch,
                saved_batch,
            )
        self.evaluations = list(state.get("evaluations", []))
        self.best_value = float(state.get("best_value", -math.inf))
        now = self.task.meta
        changed = {
            k: (meta.get(k, 1 if k == "pipeline" else None), now[k])
            for k in ("world_size", "tensor", "data", "pipeline", "zero_stage", "precision")
            if meta.get(k, 1 if k == "pipeline" else None) != now[k]
        }
        log.info(
            "resumed from %s at step %d%s",
            directory,
            meta["step"],
            f", resharded {changed}" if changed else "",
        )
        return int(meta["step"])

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
        loop, task = self.loop, self.task
        peak = peak_tflops(
            loop.peak_tflops, "fp32" if self.engine.dtype == torch.float32 else "bf16"
        )
        records: list[dict] = []
        window: list[UnreadStep] = []
        start = last = own_since = time.perf_counter()
        WAIT_CLOCK.take()  # waits count from here
        self.model.train()
        self._install_sigterm()
        first = self.resume()
        if self._due_for_eval(first) and not any(e["step"] == first for e in self.evaluations):
            self.evaluate(first)  # stopped by SIGTERM at an evaluation step: evaluate it now
        bar = progress(
            total=task.max_steps,
            initial=first,
            desc=task.description,
            unit=" steps",
            enabled=self.ctx.is_main and loop.progress,
            every=loop.log_every,
        )
        step, reason, saved = first - 1, "done", None
        loader = StepLoader(
            task.train_batches,
            task.objective,
            first=first,
            stop=task.max_steps,
            num_workers=task.loader.num_workers,
            prefetch_steps=task.loader.prefetch_steps,
            pin_memory=self.ctx.device.type == "cuda",
        )
        try:
            steps = iter(loader)
            for step in range(first, task.max_steps):
                prepared = next(steps)
                lr = lr_at(step, peak=task.peak_lr, optim=self.optim, max_steps=task.max_steps)
                self.engine.set_lr(lr)
                result = self.queue_step(prepared, train=True)
                host = {"lr": lr, "data_wait_s": loader.wait_s}
                window.append(UnreadStep(result, self.runner.update(), host))
                done = step + 1 == task.max_steps
                over_time = (
                    loop.max_time_minutes > 0
                    and time.perf_counter() - start > 60 * loop.max_time_minutes
                )
                preempted, timed_out, save_failed = agree_any(
                    self.ctx, self._sigterm, over_time, self.writer.failed()
                )
                if save_failed:  # every rank holds the same error: raise it everywhere at once
                    self.writer.wait()
                if done or timed_out:  # the last evaluation sees every micro-batch's update
                    self.runner.drain()
                if (step + 1) % loop.log_every == 0 or done or timed_out or step == 0:
                    now = time.perf_counter()
                    step_time = (now - last) / len(window)
                    values = self._read(window)  # the device has run the window's steps
                    taken = time.perf_counter()
                    own = (taken - own_since - WAIT_CLOCK.take()) / len(window)
                    own_since = taken
                    ranks = RankTimes(all_gather_object(own, self.ctx.control))  # host floats, gloo
                    records.append(self._log(step + 1, values, step_time, ranks, peak, bar))
                    window, last = [], now
                bar.update(1)
                if not preempted and (self._due_for_eval(step + 1) or done or timed_out):
                    self.evaluate(step + 1)  # on SIGTERM the save comes first (30 s grace)
                if preempted or (loop.exit_at_step and step + 1 == loop.exit_at_step):
                    reason = "sigterm" if preempted else "exit_at_step"
                    saved = self.save(step + 1)
                    log.info(
                        "%s: saved step %d and stopping",
                        "SIGTERM" if preempted else "trainer.exit_at_step",
                        step + 1,
                    )
                    break
                if loop.save_every and ((step + 1) % loop.save_every == 0 or done or timed_out):
                    saved = self.save(step + 1)
                if timed_out:
                    reason = "time_limit"
                    log.info(
                        "trainer.max_time_minutes=%s reached at step %d",
                        loop.max_time_minutes,
                        step + 1,
                    )
                    break
        finally:  # stop the workers on every path (a worker that outlives us blocks exit)
            loader.close()
        self.writer.close()  # the final (or SIGTERM) save is complete before the run ends
        bar.close()
        start_close = time.perf_counter()
        self.metrics.close()
        self.seconds["metrics_close"] = time.perf_counter() - start_close
        self._record_stop(
            reason,
            step + 1,
            saved if saved and saved.name.endswith(store.step_dir_name(step + 1)) else None,
        )
        return records

    def _read(self, window: list[UnreadStep]) -> list[dict[str, float]]:
        """The window's device values, read on the host in one transfer (a log line)."""
        names = list(window[0].engine)
        rows = torch.stack(
            [torch.cat([p.result.values, *(p.engine[k].reshape(1) for k in names)]) for p in window]
        ).tolist()
        self.engine.check_finite()
        return [
            {
                **self.step_metrics(p.result, row[: -len(names)]),
                **dict(zip(names, row[-len(names) :])),
                **p.host,
            }
            for p, row in zip(window, rows)
        ]

    def _due_for_eval(self, step: int) -> bool:
        every = self.task.eval_every
        return bool(every) and step > 0 and step % every == 0

    def _record_stop(self, reason: str, step: int, checkpoint: Path | None) -> None:
        """stop.json: why training ended and what was saved then (read by the launcher)."""
        if self.ctx.is_main:
            record = {
                "reason": reason,
                "step": step,
                "checkpoint": str(checkpoint) if checkpoint else None,
            }
            (self.run_dir / STOP_RECORD).write_text(json.dumps(record))

    def _log(
        self,
        step: int,
        window: list[dict[str, float]],
        step_time: float,
        ranks: RankTimes,
        peak: float,
        bar: Progress,
    ) -> dict:
        """One metrics.jsonl line: the window's mean losses and metrics, LR, throughput, MFU,
        and (several ranks) the slowest rank's own step time."""
        names = [
            k for k in window[0] if k not in ("tokens", "lr", "grad_norm", "skipped", "data_wait_s")
        ]
        tokens = sum(w["tokens"] for w in window) / len(window)
        config = self.task.model_config
        samples = self.task.global_batch
        flops = flops_per_step(
            config,
            samples=samples,
            seq=max(1, round(tokens / samples)),
            head_tokens=int(tokens * self.task.objective.head_fraction),
        )
        tflops = flops / step_time / 1e12 / self.ctx.layout.world_size
        last = window[-1]
        record = {
            "step": step,
            **self._epoch(step),
            **{k: sum(w[k] for w in window) / len(window) for k in names},
            "lr": last["lr"],
            "grad_norm": last["grad_norm"],
            "skipped": last["skipped"],
            "data_wait_s": sum(w["data_wait_s"] for w in window) / len(window),
            "tokens_per_s": tokens / step_time,
            "tflops_per_device": tflops,
        }
        if peak > 0:
            record["mfu"] = tflops / peak
        if len(ranks.seconds) > 1:
            record.update(ranks.metrics())
        self.metrics.log(record)
        shown = {
            "loss": f"{record['loss']:.3f}",
            "lr": f"{record['lr']:.2e}",
            "tok_s": f"{record['tokens_per_s']:.0f}",
            "tflops": f"{tflops:.3f}",
            "wait": f"{record['data_wait_s']:.3f}s",
        }
        if peak > 0:
            shown["mfu"] = f"{record['mfu']:.1%}"
        if ranks.lag() > self.loop.straggler_threshold:
            shown["slowest"] = f"rank {ranks.slowest} +{ranks.lag():.0%}"
        if self.evaluations:  # the latest evaluation's first metric (eval loss or dev metric)
            name = next(k for k in self.evaluations[-1] if k not in ("step", "epoch"))
            shown[f"eval_{name}"] = f"{self.evaluations[-1][name]:.4f}"
        bar.set_postfix(refresh=True, **shown)
        return record
