"""One run's checkpoints, as torchtitan's checkpoint manager: periodic and final saves, the best
evaluation's weights, resuming (`trainer.resume`) and the stop record the launcher reads.

The loop's own state travels with them: the evaluations so far and the best value (which the
best checkpoint is judged by), held here so that a resumed run continues them.
"""

from __future__ import annotations

import json
import logging
import math
import time
from pathlib import Path
from typing import Any

import torch

from tpformer.checkpoint import store
from tpformer.checkpoint.writer import CheckpointWriter
from tpformer.config.schema import LoopConfig
from tpformer.parallel.context import ParallelContext
from tpformer.train.task import TrainingTask

log = logging.getLogger(__name__)

STOP_RECORD = "stop.json"
"""Written by rank 0 into the run directory when training ends: why, at which step, and the
checkpoint saved then (or null). The launcher reads it after a preemption."""

LAYOUT_KEYS = ("world_size", "tensor", "data", "pipeline", "zero_stage", "precision")
"""What a resume logs as resharded when the checkpoint's layout differs."""


class Checkpointer:
    """Saves and resumes one run (its `checkpoints/` and `best/` directories)."""

    def __init__(
        self, task: TrainingTask, loop: LoopConfig, ctx: ParallelContext, run_dir: Path
    ) -> None:
        self.task, self.loop, self.ctx, self.run_dir = task, loop, ctx, run_dir
        self.writer = CheckpointWriter(ctx, background=loop.async_save)
        self.evaluations: list[dict[str, float]] = []
        self.best_value = -math.inf
        self.seconds = 0.0
        """Wall time spent saving (the training thread's share, with async saves)."""

    @property
    def root(self) -> Path:
        return self.run_dir / store.CHECKPOINTS

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
        engine = self.task.engine
        if not weights_only:  # a checkpoint holds no micro-batch in flight (pipedream)
            self.task.runner.drain()
        state: dict[str, Any] = (
            {"engine": engine.weights_state_dict()}
            if weights_only
            else {
                "engine": engine.state_dict(saving=True),
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
            root or self.root,
            step,
            state,
            meta=meta,
            keep_last=self.loop.keep_last if keep_last is None else keep_last,
            tokenizer_files=self.task.tokenizer_files,
        )
        self.seconds += time.perf_counter() - start
        return saved

    def save_if_best(self, step: int, value: float) -> bool:
        """Keep `value` (NaN counts as the worst) and, when it is the best so far (or the first),
        save the weights into <run dir>/best; whether it saved."""
        value = -math.inf if math.isnan(value) else value
        if value <= self.best_value and self.evaluations[:-1]:  # the first is kept anyway
            return False
        self.best_value = max(value, self.best_value)
        self.save(step, root=self.run_dir / "best", keep_last=1, weights_only=True)
        return True

    def resume(self) -> int:
        """Load trainer.resume at this run's layout; returns the step to continue from."""
        choice = self.loop.resume
        if choice == "none":
            return 0
        directory = store.choose_checkpoint(
            self.root,
            None if choice == "auto" else Path(choice),
            self.ctx,
            check=self.loop.verify_checkpoint,
        )
        if directory is None:
            log.info(
                "trainer.resume=auto: no intact checkpoint in %s, starting at step 0", self.root
            )
            return 0
        meta = store.read_meta(directory)
        self._check_resumable(directory, meta)
        self._load(directory, meta)
        state = meta.get("trainer", {})
        self._warn_on_other_batch(state.get("global_batch", self.task.global_batch))
        self.evaluations = list(state.get("evaluations", []))
        self.best_value = float(state.get("best_value", -math.inf))
        now = self.task.meta
        before = {k: meta.get(k, 1 if k == "pipeline" else None) for k in LAYOUT_KEYS}
        changed = {k: (before[k], now[k]) for k in LAYOUT_KEYS if before[k] != now[k]}
        resharded = f", resharded {changed}" if changed else ""
        log.info("resumed from %s at step %d%s", directory, meta["step"], resharded)
        return int(meta["step"])

    def _check_resumable(self, directory: Path, meta: dict[str, Any]) -> None:
        if meta.get("weights_only"):
            raise store.CheckpointError(
                f"{directory} holds the weights only (a fine-tuning run's best checkpoint, for "
                f"export and predictions), no optimizer state to resume; resume from a "
                f"checkpoint that trainer.save_every wrote into {self.root}"
            )
        mismatched = store.model_mismatches(meta, self.task.model_config)
        if mismatched:
            details = ", ".join(
                f"{k}: checkpoint {a} vs run {b}" for k, (a, b) in mismatched.items()
            )
            raise ValueError(f"{directory} holds another model ({details})")

    def _load(self, directory: Path, meta: dict[str, Any]) -> None:
        """The engine's state, and this rank's RNG when the same ranks wrote it."""
        rng_key = f"rng_rank{self.ctx.rank}"
        same_world = (  # per-rank RNG states only mean something for the same ranks
            meta.get("world_size") == self.ctx.layout.world_size
            and rng_key in store.saved_keys(directory)  # none in an imported checkpoint
        )
        template: dict[str, Any] = {"engine": self.task.engine}
        if same_world:
            template[rng_key] = store.rng_state()
        store.load(directory, template)
        if same_world:
            torch.set_rng_state(template[rng_key]["cpu"])

    def _warn_on_other_batch(self, saved_batch: int) -> None:
        if saved_batch != self.task.global_batch:
            log.warning(
                "the checkpoint trained with a global batch of %d samples per step, this run "
                "with %d: the steps from here train on other samples than the run that wrote "
                "it (set trainer.global_batch_size=%d to continue its curve on this world)",
                saved_batch,
                self.task.global_batch,
                saved_batch,
            )

    def record_stop(self, reason: str, step: int, saved: Path | None) -> None:
        """stop.json: why training ended and the checkpoint of that step, if one was saved."""
        if not self.ctx.is_main:
            return
        at_stop = saved if saved and saved.name.endswith(store.step_dir_name(step)) else None
        record = {"reason": reason, "step": step, "checkpoint": str(at_stop) if at_stop else None}
        (self.run_dir / STOP_RECORD).write_text(json.dumps(record))
