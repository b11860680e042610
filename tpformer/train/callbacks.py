"""Callbacks: code of the user's own at the training loop's seams, without editing the loop
(transformers' TrainerCallback, Lightning's hooks). Every rank calls them with the same values
(the metrics are global means), so a callback that stops the run stops it on every rank; a
callback that writes elsewhere (a tracker, a file) should check `run.is_main`.

The hooks and when the loop calls them:

    on_train_begin(run)            after the resume, before the first step
    lr(run, step, lr) -> lr        before each step: the learning rate it takes (the schedule's)
    on_step_end(run, step, m)      after each step; m is the step's logged record (loss, lr,
                                   tokens/s, ...) every trainer.log_every steps, when the loop
                                   reads the device anyway, else None (no host sync per step)
    on_evaluate(run, step, m)      after each evaluation, with its metrics
    on_save(run, step, path)       after each checkpoint of the run (save_every, the stop)
    on_train_end(run, records)     after the last step, with the logged records

`run.stop()` ends the run after the current step, agreed by every rank as SIGTERM is, with a
checkpoint of that step (reason "callback" in the stop record)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch import nn

    from tpformer.parallel.context import ParallelContext


@dataclass
class Run:
    """What a callback sees of the run, and its one lever: stop()."""

    model: nn.Module
    ctx: ParallelContext
    run_dir: Path
    max_steps: int
    step: int = 0
    """Steps done so far."""
    stop_requested: bool = field(default=False, init=False)

    @property
    def is_main(self) -> bool:
        """Global rank 0: where a callback that writes something should write it."""
        return self.ctx.is_main

    def stop(self) -> None:
        """End the run after the current step, saving it (every rank agrees)."""
        self.stop_requested = True


class Callback:
    """Subclass and override the hooks you need; each default does nothing."""

    def on_train_begin(self, run: Run) -> None:
        pass

    def lr(self, run: Run, step: int, lr: float) -> float:
        return lr

    def on_step_end(self, run: Run, step: int, metrics: dict[str, Any] | None) -> None:
        pass

    def on_evaluate(self, run: Run, step: int, metrics: dict[str, float]) -> None:
        pass

    def on_save(self, run: Run, step: int, path: Path) -> None:
        pass

    def on_train_end(self, run: Run, records: list[dict]) -> None:
        pass
