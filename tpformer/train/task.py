"""What a task hands the training loop (`TrainingTask`), and the values a queued step leaves on
the device: everything that differs between pretraining and fine-tuning arrives here."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from torch import Tensor, nn

from tpformer.config.schema import LoaderConfig, ModelConfig
from tpformer.data.steps import StepSource
from tpformer.engine import ZeroEngine
from tpformer.engine.step_runner import StepRunner
from tpformer.train.objectives import Objective


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


class EvalSteps(Protocol):
    """What an evaluator may ask of the loop: a step of held-out batches run and read."""

    def run_step(self, step: int, batches: StepSource, *, train: bool) -> dict[str, float]: ...


class Evaluator(Protocol):
    """Runs with the model in eval mode and every parameter gathered; returns its metrics.
    Pretraining's runs held-out steps through `steps`; fine-tuning's predicts through its
    step runner (StepRunner.outputs) and leaves `steps` unused."""

    def __call__(self, steps: EvalSteps) -> dict[str, float]: ...


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
