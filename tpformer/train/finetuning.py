"""The fine-tuning task: BertForSequenceClassification on a GLUE task or the user's own
classification, regression or multi-label files, for the one loop.

The model starts from a tpformer checkpoint or a Hugging Face BERT; the task's specifics
(features, the order of training examples, metrics, submission files) live in
tpformer.data.glue. Dev is
evaluated after every epoch; the best epoch by the task's first metric is checkpointed in
<run dir>/best with its test predictions; results.json holds every evaluation.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import torch

from tpformer.checkpoint import store
from tpformer.config.derive import finetune_micro_batching
from tpformer.config.rules.parallel import (
    context_multiple,
    validate_pipeline,
    validate_recompute_granularity,
)
from tpformer.config.schema import FinetuneConfig, ModelConfig
from tpformer.convert import load_classifier, read_model_source
from tpformer.data.glue import GlueTask, score
from tpformer.data.glue.batches import GlueTrainSteps, prediction_batch, prediction_order
from tpformer.data.glue.features import dev_splits, load_examples, test_splits
from tpformer.data.glue.own import finetune_task
from tpformer.data.glue.submission import submission_name, write_submission
from tpformer.data.tokenizer import Tokenizer
from tpformer.engine.parallelize import Parallelized, parallelize
from tpformer.engine.step_runner import StepRunner
from tpformer.models import BertForSequenceClassification
from tpformer.parallel.comm import all_gather_object
from tpformer.parallel.context import ParallelContext
from tpformer.planner.candidate import Workload
from tpformer.planner.split import plan_pipeline
from tpformer.train.loop import BestCheckpoint, Trainer, TrainingTask
from tpformer.train.objectives import ClassificationObjective
from tpformer.train.schedule import scaled_lr
from tpformer.train.task import EvalSteps

log = logging.getLogger(__name__)


class GluePredictor:
    """Predictions (class ids, or scores for STS-B) of whole splits, the DP ranks sharing each."""

    def __init__(
        self,
        runner: StepRunner,
        splits: dict[str, list[dict]],
        *,
        task: GlueTask,
        token_budget: int,
        pad_id: int,
        ctx: ParallelContext,
        pad_multiple: int = 1,
    ) -> None:
        self.runner, self.splits, self.task = runner, splits, task
        self.token_budget, self.pad_id, self.ctx = token_budget, pad_id, ctx
        self.pad_multiple = pad_multiple

    @torch.no_grad()
    def predict(self, split: str) -> tuple[torch.Tensor, list[int]]:
        """Predictions in the split's order (class ids, scores, or multi-hot rows), made in
        length-sorted batches of up to `token_budget` padded tokens. Call with the model in
        eval mode and its parameters gathered (the loop's evaluate does)."""
        examples, dp = self.splits[split], self.ctx.dp
        done: list[tuple[int, Any]] = []
        for indices in prediction_order(
            examples, token_budget=self.token_budget, dp_size=dp.size, dp_rank=dp.rank
        ):
            batch = prediction_batch(examples, indices, self.pad_id, self.pad_multiple)
            logits = self.logits({k: v.to(self.ctx.device) for k, v in batch.items()})
            if self.task.multilabel:  # each label on when its sigmoid passes 0.5
                out = (logits > 0).float()
            else:
                out = logits.squeeze(-1) if self.task.labels is None else logits.argmax(-1)
            done += zip(indices, out.float().cpu().tolist())
        by_index = dict(p for part in all_gather_object(done, dp) for p in part)
        preds = torch.tensor([by_index[i] for i in range(len(examples))], dtype=torch.float)
        return preds, [e["index"] for e in examples]

    def logits(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """The model's logits, from the step runner (through the stages when pipelined)."""
        return self.runner.outputs(batch, lambda out: out.logits)


class GlueDev:
    """Fine-tuning's evaluator: the task's metrics on each dev split (MNLI: m_ and mm_ prefixed)."""

    def __init__(self, predictor: GluePredictor, splits: tuple[str, ...]) -> None:
        self.predictor, self.dev_splits = predictor, splits

    @property
    def main_metric(self) -> str:
        first = self.predictor.task.metrics[0]
        return first if len(self.dev_splits) == 1 else f"{self._prefix(self.dev_splits[0])}{first}"

    def _prefix(self, split: str) -> str:
        return "" if len(self.dev_splits) == 1 else f"{split.removeprefix('dev_')}_"

    def __call__(self, steps: EvalSteps) -> dict[str, float]:
        metrics: dict[str, float] = {}
        for split in self.dev_splits:
            pred, _ = self.predictor.predict(split)
            gold = torch.tensor([e["label"] for e in self.predictor.splits[split]])
            metrics.update(
                {
                    self._prefix(split) + k: v
                    for k, v in score(self.predictor.task, pred, gold).items()
                }
            )
        return metrics


def batch_width_multiple(
    requested: int, max_length: int, ctx: ParallelContext, max_positions: int
) -> int:
    """What every batch's width is padded to a multiple of: data.pad_to_multiple_of, rounded up
    to a multiple of the TP degree under sequence parallelism and of 2 x cp (x tp with sequence
    parallelism) under context parallelism (both split the sequence)."""
    split = context_multiple(ctx.cp.size, ctx.tp.size, ctx.sequence_parallel)
    multiple = math.lcm(requested, split) if split > 1 else requested
    if multiple != requested and ctx.is_main:
        log.info(
            "sequence/context parallelism: each batch is padded to a multiple of %d tokens "
            "(data.pad_to_multiple_of=%d, parallel.tensor=%d, parallel.context=%d)",
            multiple,
            requested,
            ctx.tp.size,
            ctx.cp.size,
        )
    widest = -(-max_length // multiple) * multiple
    if max_length <= max_positions < widest:  # the padding alone would overflow the positions
        raise ValueError(
            f"data.max_length={max_length} padded to a multiple of {multiple} is "
            f"{widest}, beyond the model's max_position_embeddings={max_positions}; "
            f"lower data.max_length to {max_positions - max_positions % multiple}"
        )
    return multiple


def _checkpoint_meta(
    config: FinetuneConfig, task: GlueTask, model: ModelConfig, ctx: ParallelContext
) -> dict[str, Any]:
    """What a fine-tuning checkpoint records: the model, the layout, the task and its labels
    (the HF export's id2label)."""
    return store.checkpoint_meta(
        model,
        config.parallel,
        ctx.layout,
        task="classification",
        run_config={"finetune": asdict(config)},
        num_labels=task.num_labels,
        glue_task=config.task,
        id2label=dict(enumerate(task.labels)) if task.labels else {0: "score"},
        **({"problem_type": "multi_label_classification"} if task.multilabel else {}),
    )


def _train_steps(
    config: FinetuneConfig,
    task: GlueTask,
    ctx: ParallelContext,
    examples: Any,
    pad_id: int,
    micro: int,
    pad_multiple: int,
) -> GlueTrainSteps:
    """This DP rank's micro-batches of each step of the training split."""
    return GlueTrainSteps(
        examples,
        batch_size=config.trainer.batch_size,
        micro_batch_size=micro,
        dp_size=ctx.dp.size,
        dp_rank=ctx.dp.rank,
        seed=config.parallel.seed,
        group_by_length=config.data.group_by_length,
        pad_id=pad_id,
        float_labels=task.float_labels,
        pad_multiple=pad_multiple,
    )


def _evaluation(
    config: FinetuneConfig,
    task: GlueTask,
    ctx: ParallelContext,
    splits: dict[str, Any],
    pad_id: int,
    micro: int,
    pad_multiple: int,
    runner: StepRunner,
    run_dir: Path,
) -> tuple[GlueDev, Callable[[int], None]]:
    """The dev evaluator and what the best evaluation writes (the test splits' predictions)."""
    data = config.data
    predictor = GluePredictor(
        runner,
        splits,
        task=task,
        # prediction keeps no activations for backward, so twice the training micro-batch's
        # worst case fits; measured on CPU (MiniLM, 2 cores, TP=1 and TP=2) faster than 1x or 4x
        token_budget=2 * micro * data.max_length,
        pad_id=pad_id,
        ctx=ctx,
        pad_multiple=pad_multiple,
    )
    evaluator = GlueDev(predictor, dev_splits(task, data))

    def write_predictions(step: int) -> None:
        for split in test_splits(task, data):
            pred, index = predictor.predict(split)
            if ctx.is_main:
                name = submission_name(task, split)
                write_submission(run_dir / "predictions" / f"{name}.tsv", task, pred, index)

    return evaluator, write_predictions


def _micro_batch(config: FinetuneConfig, ctx: ParallelContext, model: ModelConfig) -> int:
    """trainer.micro_batch_size (default: this DP rank's whole batch), checked with the
    recomputation and pipeline settings against the loaded model's depth."""
    num_layers = model.num_layers
    validate_recompute_granularity(config.parallel, num_layers)
    micro, accumulation = finetune_micro_batching(config.trainer, ctx.dp.size)
    validate_pipeline(config.parallel, ctx.layout.pp, num_layers, accumulation)
    return micro


def _parallelized(
    config: FinetuneConfig,
    ctx: ParallelContext,
    model: BertForSequenceClassification,
    train: Any,
    micro: int,
) -> Parallelized:
    """The model parallelized at this layout (its pipeline split chosen first; profile times
    the first training micro-batch)."""
    plan = plan_pipeline(  # the config stays as given: fine-tuning has no pipedream split
        lambda: model,
        model.config,
        config.parallel,
        ctx,
        head_fraction=0.0,
        seq=config.data.max_length,
        micro_batches=config.trainer.batch_size // (micro * ctx.dp.size),
        first_batch=lambda: train(0)[0][1],
    )
    return parallelize(
        model,
        config.parallel,
        config.optim,
        ctx,
        split=plan.split.split if plan else None,
        compile_blocks=config.trainer.compile,
    )


def finetuning_workload(config: FinetuneConfig) -> Workload:
    """What the planner prices for this job: the init's model with the job's model overrides,
    the task's classifier, batches data.max_length wide (the widest a batch can be)."""
    source = read_model_source(Path(config.init), "init")
    overrides: dict[str, Any] = config.model.given()
    model = replace(source.config, **overrides)
    return Workload.finetuning(config, model, finetune_task(config.task, config.data).num_labels)


def finetuning_trainer(config: FinetuneConfig, ctx: ParallelContext, run_dir: Path) -> Trainer:
    """Load the model and the task's splits, parallelize; the loop runs it."""
    t, data = config.trainer, config.data
    task = finetune_task(config.task, data)
    model, tokenizer_path = load_classifier(
        Path(config.init), ctx, num_labels=task.num_labels, overrides=config.model.given()
    )
    micro = _micro_batch(config, ctx, model.config)
    tokenizer = Tokenizer(tokenizer_path)
    tokenizer.check_bert_specials()
    tokenizer.check_vocab(model.config.vocab_size)
    splits = {
        split: load_examples(task, data, split, tokenizer, rank=ctx.rank)
        for split in ("train", *dev_splits(task, data), *test_splits(task, data))
    }
    pad_multiple = batch_width_multiple(
        data.pad_to_multiple_of, data.max_length, ctx, model.config.max_position_embeddings
    )
    train = _train_steps(config, task, ctx, splits["train"], tokenizer.pad_id, micro, pad_multiple)
    wrapped = _parallelized(config, ctx, model, train, micro)
    evaluator, write_predictions = _evaluation(
        config, task, ctx, splits, tokenizer.pad_id, micro, pad_multiple, wrapped.runner, run_dir
    )
    steps = math.ceil(t.epochs * train.steps_per_epoch)
    return Trainer(
        TrainingTask(
            model=model,
            engine=wrapped.engine,
            runner=wrapped.runner,
            objective=ClassificationObjective(),
            train_batches=train,
            evaluator=evaluator,
            max_steps=steps,
            global_batch=t.batch_size,
            peak_lr=scaled_lr(config.optim, t.batch_size),
            model_config=model.config,
            meta=_checkpoint_meta(config, task, model.config, ctx),
            eval_every=train.steps_per_epoch,
            steps_per_epoch=train.steps_per_epoch,
            best=BestCheckpoint(evaluator.main_metric, write_predictions),
            tokenizer_files=tokenizer.files,
            description=f"finetune {config.task}",
            loader=data,
        ),
        t,
        config.optim,
        ctx,
        run_dir,
    )


def write_results(trainer: Trainer, config: FinetuneConfig, wall_time_s: float) -> dict:
    """results.json: every evaluation, the best by the main metric, the wall time and, of it,
    the seconds spent writing checkpoints, the best epoch's test predictions and the metrics
    files (`output_seconds`)."""
    best = trainer.task.best
    if best is None:
        raise ValueError("results.json is written for a fine-tuning run (one that keeps its best)")
    metric = best.metric
    evaluations = trainer.evaluations
    results: dict = {
        "task": config.task,
        "init": config.init,
        "steps": trainer.task.max_steps,
        "evaluations": evaluations,
        "wall_time_s": wall_time_s,
        "output_seconds": {
            k: round(v, 3)
            for k, v in {"checkpoints": trainer.checkpoints.seconds, **trainer.seconds}.items()
        },
    }
    if evaluations:  # a NaN metric counts as the worst value, as in the loop
        results["best"] = max(
            evaluations, key=lambda e: -math.inf if math.isnan(e[metric]) else e[metric]
        )
    if trainer.ctx.is_main:
        (trainer.run_dir / "results.json").write_text(json.dumps(results, indent=1))
    return results
