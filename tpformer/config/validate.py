"""The one validator: every rule of a run, checked at the entry point before any process group
exists, each error naming the key, the value and what is valid. The rules sit beside their
schema group (config/rules/); this applies them to a pretraining or fine-tuning run at its
layout. Library code takes the typed values it produces and does not check them again."""

from __future__ import annotations

from tpformer.config.derive import apply_global_batch, apply_pair_recipe
from tpformer.config.rules.choices import check_choices
from tpformer.config.rules.data import validate_data, validate_packing, validate_task_data
from tpformer.config.rules.model import (
    validate_fp8,
    validate_model,
    validate_pair_head,
)
from tpformer.config.rules.parallel import (
    validate_context_parallel,
    validate_engine,
    validate_pipedream,
    validate_pipeline,
    validate_recompute_granularity,
    validate_replication,
    validate_sequence_parallel,
)
from tpformer.config.rules.trainer import validate_loggers
from tpformer.config.schema import Config, FinetuneConfig
from tpformer.parallel.layout import Layout


def validate(config: Config, layout: Layout, *, device_type: str = "cpu") -> None:
    """Every rule of a pretraining run at `layout`, checked before the first collective;
    trainer.global_batch_size, when set, fixes trainer.grad_accum for this layout (before the
    pipeline's rules on the micro-batch count)."""
    validate_loggers(config.trainer.loggers)
    validate_model(config.model, layout.tp)
    validate_engine(config.parallel, config.optim, device_type)
    if config.parallel.precision == "fp8":
        validate_fp8(config.model, layout.tp)
    validate_recompute_granularity(config.parallel, config.model.num_layers)
    check_choices(config)
    apply_global_batch(config.trainer, layout.dp)
    if config.data.seq_length > config.model.max_position_embeddings:
        raise ValueError(
            f"data.seq_length={config.data.seq_length} exceeds "
            f"model.max_position_embeddings={config.model.max_position_embeddings}"
        )
    validate_sequence_parallel(config.parallel, layout.tp, config.data.seq_length)
    validate_context_parallel(layout, config.parallel, config.data.seq_length)
    apply_pair_recipe(config.model, config.data)
    validate_pair_head(config.model, config.data)
    t = config.trainer
    validate_pipeline(config.parallel, layout.pp, config.model.num_layers, t.grad_accum)
    validate_pipedream(config.parallel, layout.pp, compiled=t.compile)
    validate_replication(config.parallel, t.grad_accum)
    validate_data(config.data)
    validate_packing(config.data, config.model.arch, layout.cp)


def validate_finetune(config: FinetuneConfig, layout: Layout, *, device_type: str = "cpu") -> None:
    """The rules of a fine-tuning run at `layout` that do not need its checkpoint."""
    validate_loggers(config.trainer.loggers)
    validate_engine(config.parallel, config.optim, device_type)
    validate_sequence_parallel(config.parallel, layout.tp, None)  # fine-tuning pads instead
    validate_context_parallel(layout, config.parallel, None)
    check_choices(config)
    validate_task_data(config.task, config.data)
    t = config.trainer
    micro = t.micro_batch_size or t.batch_size // layout.dp
    if t.batch_size < 1 or micro < 1 or t.batch_size % (micro * layout.dp):
        raise ValueError(
            f"trainer.batch_size={t.batch_size} must be a multiple of "
            f"trainer.micro_batch_size={micro} x dp={layout.dp}"
        )
    validate_pipedream(config.parallel, layout.pp, compiled=t.compile)
    validate_replication(config.parallel, 1, finetuning=True)
    if layout.pp > 1:  # the layer count is checked once the checkpoint is read
        validate_pipeline(
            config.parallel, layout.pp, layout.pp, t.batch_size // (micro * layout.dp)
        )
