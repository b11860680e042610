"""The pretraining task: BERT (MLM + NSP/SOP) or GPT (causal LM) on a corpus, for the one loop.

Data is prepared first (a bad corpus or tokenizer fails before any model is built); step s
trains on global samples [s x G, (s+1) x G), which DP rank r slices and cuts into micro-batches
(data/loader.py), so the samples of a step never depend on the layout.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from torch import Tensor, nn

from tpformer.checkpoint import store
from tpformer.config.derive import mlm_fraction
from tpformer.config.schema import Config
from tpformer.data import load_pretraining_data, prepare_data
from tpformer.data.blend import EVAL_PREFIX, BlendedSamples, SampleSource
from tpformer.data.loader import micro_batch_ranges
from tpformer.data.steps import StepSource
from tpformer.data.tokenizer import Tokenizer
from tpformer.engine.parallelize import Parallelized, parallelize
from tpformer.models import build_model
from tpformer.parallel.comm import all_gather_object, broadcast_object
from tpformer.parallel.context import ParallelContext
from tpformer.parallel.init import logical_shape
from tpformer.planner.split import SplitChoice, plan_pipeline
from tpformer.train.loop import Trainer, TrainingTask
from tpformer.train.objectives import Objective, objective_for
from tpformer.train.schedule import scaled_lr
from tpformer.train.startup_report import attention_line, format_plan, matmul_line
from tpformer.train.task import EvalSteps

log = logging.getLogger(__name__)


def prepare_data_on_rank0(
    config: Config, ctx: ParallelContext
) -> tuple[Path, tuple[Path, ...]] | None:
    """Rank 0 trains the tokenizer and preprocesses the corpus (or finds them cached); every
    rank gets the paths, or rank 0's error, so no rank is left waiting."""
    if config.data.source == "synthetic" and not config.data.blend:
        return None
    outcome: object = None
    if ctx.is_main:
        try:
            outcome = prepare_data(
                config.data, config.model.vocab_size, progress=config.trainer.progress
            )
        except Exception as err:
            broadcast_object((type(err).__name__, str(err)), monitor=ctx.monitor)
            raise
    outcome = broadcast_object(outcome, monitor=ctx.monitor)
    if isinstance(outcome, tuple) and isinstance(outcome[0], str):
        raise RuntimeError(f"rank 0 could not prepare the data: {outcome[0]}: {outcome[1]}")
    return outcome  # type: ignore[return-value]


@dataclass
class PretrainingSteps:
    """This DP rank's micro-batches of each step of one split: fixed-width samples."""

    data: SampleSource
    split: str
    seq_length: int
    micro_batch_size: int
    grad_accum: int
    dp_size: int
    dp_rank: int

    def __call__(self, step: int) -> list[tuple[int, dict[str, Tensor]]]:
        ranges = micro_batch_ranges(
            step,
            micro_batch_size=self.micro_batch_size,
            grad_accum=self.grad_accum,
            dp_size=self.dp_size,
            dp_rank=self.dp_rank,
        )
        return [(r.start, self.data.batch(r, split=self.split)) for r in ranges]

    def mask_width(self, step: int) -> int:
        return self.seq_length  # every sample is data.seq_length tokens


class HeldOutLoss:
    """Pretraining's evaluator: the objective's means over `steps` batches of held-out data;
    for a blend, each corpus's (as <label>/loss, ...) and their mean weighted as the blend."""

    def __init__(self, batches: dict[str, tuple[StepSource, float]], steps: int) -> None:
        self.batches, self.steps = batches, steps

    def _means(self, steps: EvalSteps, batches: StepSource) -> dict[str, float]:
        parts = [steps.run_step(i, batches, train=False) for i in range(self.steps)]
        return {k: sum(p[k] for p in parts) / len(parts) for k in parts[0] if k != "tokens"}

    def __call__(self, steps: EvalSteps) -> dict[str, float]:
        if list(self.batches) == ["eval"]:
            return self._means(steps, self.batches["eval"][0])
        per_corpus = {
            split.removeprefix(EVAL_PREFIX): (self._means(steps, batches), weight)
            for split, (batches, weight) in self.batches.items()
        }
        keys = next(iter(per_corpus.values()))[0]
        blended = {k: sum(m[k] * w for m, w in per_corpus.values()) for k in keys}
        return blended | {
            f"{label}/{k}": v for label, (means, _) in per_corpus.items() for k, v in means.items()
        }


def eval_splits(data: SampleSource) -> dict[str, float]:
    """The held-out splits to evaluate and their weights: one, or one per corpus of a blend."""
    return data.eval_splits if isinstance(data, BlendedSamples) else {"eval": 1.0}


def _step_batches(
    config: Config, ctx: ParallelContext, data: Any
) -> Callable[[str], PretrainingSteps]:
    """split -> this DP rank's micro-batches of each step of that split."""
    t = config.trainer

    def batches(split: str) -> PretrainingSteps:
        return PretrainingSteps(
            data,
            split,
            seq_length=config.data.seq_length,
            micro_batch_size=t.micro_batch_size,
            grad_accum=t.grad_accum,
            dp_size=ctx.dp.size,
            dp_rank=ctx.dp.rank,
        )

    return batches


def log_plan(
    config: Config,
    ctx: ParallelContext,
    model: nn.Module,
    wrapped: Parallelized,
    split: SplitChoice | None,
    total_params: int,
) -> None:
    """The startup plan (layout, parameters per stage, memory and time predicted) and its
    warnings, in the log: rank 0's, the other ranks only join the gather (the plan's layout
    search is the same on each; done once, it is said once)."""
    per_rank = all_gather_object(
        sum(s.numel for b in wrapped.engine.buckets for s in b.segments), ctx.pp
    )
    if not ctx.is_main:
        return
    stage_params = [int(per_rank[ctx.layout.peer(r, 0)]) for r in range(ctx.layout.pp)]
    plan, warnings = format_plan(
        config,
        ctx.layout,
        stage_params,
        total_params,
        wrapped.recomputed,
        split,
        device_type=ctx.device.type,
        attention=attention_line(model),
        matmuls=matmul_line(model),
    )
    log.info("plan:\n%s", plan)
    for warning in warnings:
        log.warning("%s", warning)


def _parallelized(
    config: Config,
    ctx: ParallelContext,
    task: str,
    objective: Objective,
    first_batch: Callable[[], dict[str, Tensor]],
) -> tuple[Config, ParallelContext, nn.Module, Parallelized, SplitChoice | None]:
    """The pipeline split chosen (pipedream: the config and groups made final for its stages'
    workers, on a probe model it times), then the model built and parallelized at it."""
    probe_ctx = ctx
    plan = plan_pipeline(
        lambda: build_model(config.model, probe_ctx, task=task),
        config.model,
        config.parallel,
        ctx,
        head_fraction=objective.head_fraction,
        seq=config.data.seq_length,
        micro_batches=config.trainer.grad_accum,
        first_batch=first_batch,
    )
    if plan is not None:
        config, ctx = replace(config, parallel=plan.parallel), plan.ctx
    model = build_model(config.model, ctx, task=task)
    wrapped = parallelize(
        model,
        config.parallel,
        config.optim,
        ctx,
        split=plan.split.split if plan else None,
        compile_blocks=config.trainer.compile,
    )
    return config, ctx, model, wrapped, plan.split if plan else None


def pretraining_trainer(config: Config, ctx: ParallelContext, run_dir: Path) -> Trainer:
    """Prepare the data, choose the pipeline split, build and parallelize the model, log the
    plan; the loop runs it."""
    m, t = config.model, config.trainer
    task = "pretraining" if m.arch == "bert" else "causal_lm"
    prepared = prepare_data_on_rank0(config, ctx)
    data = load_pretraining_data(config.data, m, seed=config.parallel.seed, prepared=prepared)
    global_batch = t.micro_batch_size * t.grad_accum * ctx.dp.size
    objective = objective_for(
        task, mask_prob=mlm_fraction(config.data), pair_head=m.pooler == "tanh"
    )

    batches = _step_batches(config, ctx, data)

    def first_batch() -> dict[str, Tensor]:
        return objective.model_inputs(batches("train")(0)[0][1])

    config, ctx, model, wrapped, split = _parallelized(config, ctx, task, objective, first_batch)
    total_params = sum(logical_shape(p).numel() for p in model.parameters())
    log_plan(config, ctx, model, wrapped, split, total_params)
    run_config = {k: v for k, v in asdict(config).items() if k != "model"}
    return Trainer(
        TrainingTask(
            model=model,
            engine=wrapped.engine,
            runner=wrapped.runner,
            objective=objective,
            train_batches=batches("train"),
            evaluator=HeldOutLoss(
                {split: (batches(split), w) for split, w in eval_splits(data).items()},
                t.eval_steps,
            ),
            max_steps=t.max_steps,
            global_batch=global_batch,
            peak_lr=scaled_lr(config.optim, global_batch),
            model_config=m,
            meta=store.checkpoint_meta(
                m, config.parallel, ctx.layout, task=task, run_config=run_config
            ),
            eval_every=t.eval_every,
            tokenizer_files=Tokenizer(prepared[0]).files if prepared else [],
            loader=config.data,
        ),
        t,
        config.optim,
        ctx,
        run_dir,
    )
