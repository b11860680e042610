"""The one validator: every rule of a run, checked at the entry point before any process group
exists, each error naming the key, the value and what is valid. Library code takes the typed
values it produces and does not check them again."""

from __future__ import annotations

import dataclasses
import math
import typing
from collections.abc import Sequence
from enum import Enum

from tpformer.config.derive import apply_global_batch
from tpformer.config.model_rules import validate_model_family, validate_model_layout
from tpformer.config.schema import (
    Config,
    CorpusConfig,
    DataConfig,
    FinetuneConfig,
    ModelConfig,
    OptimConfig,
    ParallelConfig,
)
from tpformer.parallel.layout import Layout, check_split, divisors


def check_choices(config: object, prefix: str = "") -> None:
    """Every field holds a value its declaration allows: an Enum-typed field one of its values
    (Hydra already rejects others when it composes; this catches configs built in code), a
    numeric field with a `ranged` declaration a value in its range."""
    hints = typing.get_type_hints(type(config))
    for f in dataclasses.fields(config):  # type: ignore[arg-type]
        value, kind = getattr(config, f.name), hints[f.name]
        if dataclasses.is_dataclass(value):
            check_choices(value, f"{prefix}{f.name}.")
        elif isinstance(kind, type) and issubclass(kind, Enum):
            allowed = [m.value for m in kind]
            if value not in allowed:
                raise ValueError(f"{prefix}{f.name}={value!r} is not one of {allowed}")
        elif "range" in f.metadata and isinstance(value, (int, float)):
            bounds = f.metadata["range"]
            if not bounds.contains(value):
                raise ValueError(f"{prefix}{f.name}={value} must be {bounds}")


def validate_model(model: ModelConfig, tp: int) -> None:
    """Raise ValueError if `model` cannot be built or cannot be split over `tp` ranks."""
    check_choices(model, "model.")
    if model.hidden_size % model.num_heads != 0:
        raise ValueError(
            f"model.hidden_size={model.hidden_size} is not divisible by "
            f"model.num_heads={model.num_heads}; "
            f"valid head counts are {divisors(model.hidden_size)}"
        )
    if model.num_heads % tp != 0:
        raise ValueError(
            f"parallel.tensor={tp} must divide model.num_heads={model.num_heads} "
            f"(valid: {divisors(model.num_heads)})"
        )
    if model.intermediate_size % tp != 0:
        raise ValueError(
            f"parallel.tensor={tp} must divide model.intermediate_size={model.intermediate_size}"
        )
    validate_model_family(model, tp)


def validate_engine(parallel: ParallelConfig, optim: OptimConfig, device_type: str) -> None:
    """Reject bad engine settings before any buffer or collective exists."""
    check_choices(parallel, "parallel.")
    check_choices(optim, "optim.")
    if parallel.cpu_offload == "optimizer+params" and parallel.zero_stage != 3:
        raise ValueError(
            f"parallel.cpu_offload=optimizer+params needs parallel.zero_stage=3 "
            f"(got {parallel.zero_stage}): only stage 3 keeps parameter partitions"
        )
    if parallel.grad_compression == "powersgd" and parallel.zero_stage > 1:
        raise ValueError(
            f"parallel.grad_compression=powersgd needs parallel.zero_stage 0 or 1 "
            f"(got {parallel.zero_stage}): stages 2-3 keep only gradient shards, which "
            "low-rank factors of whole matrices do not split into; use "
            "grad_compression=bf16 (any stage) or none"
        )
    if parallel.precision == "fp16" and device_type == "cpu":
        raise ValueError(
            "parallel.precision=fp16 needs a GPU: CPU kernels for half precision are "
            "slow or missing; use parallel.precision=bf16 or fp32 on CPU"
        )
    if optim.min_lr > optim.lr:
        raise ValueError(f"optim.min_lr={optim.min_lr} must not exceed optim.lr={optim.lr}")


def validate_sequence_parallel(parallel: ParallelConfig, tp: int, seq_length: int | None) -> None:
    """Sequence parallelism splits each sequence over the TP group (of `tp` ranks): it needs
    one, and (for the fixed-length pretraining sequences) a length it divides. Fine-tuning pads
    instead."""
    if not parallel.sequence_parallel:
        return
    if tp == 1:
        raise ValueError(
            "parallel.sequence_parallel=true needs parallel.tensor > 1 (got "
            "parallel.tensor=1): it splits the sequence across the TP group"
        )
    if seq_length is not None and seq_length % tp:
        below = seq_length - seq_length % tp
        raise ValueError(
            f"data.seq_length={seq_length} must be divisible by parallel.tensor="
            f"{tp} with parallel.sequence_parallel=true (e.g. {below} or {below + tp})"
        )


def context_multiple(cp: int, tp: int, sequence_parallel: bool) -> int:
    """What a sequence length must be a multiple of for context parallelism (two mirrored chunks
    per CP rank) and, with sequence parallelism, for the TP split of each CP rank's part."""
    multiple = 2 * cp if cp > 1 else 1
    return math.lcm(multiple, cp * tp) if sequence_parallel else multiple


def validate_context_parallel(
    layout: Layout, parallel: ParallelConfig, seq_length: int | None
) -> None:
    """Context parallelism splits every sequence into 2 x cp chunks (fixed-length pretraining
    sequences must divide; fine-tuning pads instead)."""
    if layout.cp == 1:
        return
    multiple = context_multiple(layout.cp, layout.tp, parallel.sequence_parallel)
    if seq_length is not None and seq_length % multiple:
        below = seq_length - seq_length % multiple
        raise ValueError(
            f"data.seq_length={seq_length} must be divisible by {multiple} with "
            f"parallel.context={layout.cp} (two mirrored chunks per CP rank"
            + (", each split over the TP group" if parallel.sequence_parallel else "")
            + f"); e.g. {below or multiple} or {below + multiple}"
        )


def validate_pipeline(
    parallel: ParallelConfig, p: int, num_layers: int, micro_batches: int
) -> None:
    """Pipeline stages (`p` of them) need layers to hold, micro-batches to fill them and an
    engine that keeps whole gradients; a split list must match the model."""
    schedule = parallel.pipeline_schedule
    split = parallel.pipeline_split
    if p == 1:
        return
    if p > num_layers:
        raise ValueError(
            f"parallel.pipeline={p} exceeds the model's num_layers={num_layers}: "
            f"every stage needs a layer (valid: 1 to {num_layers})"
        )
    if parallel.zero_stage >= 2:
        raise ValueError(
            f"parallel.zero_stage={parallel.zero_stage} is not supported with "
            f"parallel.pipeline={p}: stages 2-3 reduce-scatter (and stage 3 re-gathers) "
            "each layer's gradients and parameters on every micro-batch's backward, "
            "which the pipeline interleaves; use zero_stage 0 or 1 (optimizer state "
            "sharded over each stage's DP group)"
        )
    chunks = parallel.virtual_stages if schedule == "interleaved_1f1b" else 1
    if schedule == "interleaved_1f1b" and micro_batches % p:
        raise ValueError(
            f"parallel.pipeline_schedule=interleaved_1f1b needs the micro-batches per "
            f"step ({micro_batches}) to be a multiple of parallel.pipeline={p}; set "
            f"trainer.grad_accum to a multiple of {p}"
        )
    layers = list(parallel.pipeline_layers)
    if layers and split != "balanced":
        raise ValueError(
            f"parallel.pipeline_layers={layers} is the split; parallel.pipeline_split={split} "
            "would choose another: leave pipeline_split=balanced or pipeline_layers empty"
        )
    if not layers:
        if schedule == "interleaved_1f1b" and split == "balanced" and num_layers % (p * chunks):
            raise ValueError(
                f"parallel.pipeline_schedule=interleaved_1f1b splits the "
                f"num_layers={num_layers} layers into parallel.pipeline={p} x "
                f"parallel.virtual_stages={chunks} equal chunks: it must be a "
                f"multiple of {p * chunks}"
            )
        return
    check_split(
        layers,
        num_layers,
        p * chunks,
        f"parallel.pipeline={p}" + (f" x virtual_stages={chunks}" if chunks > 1 else ""),
    )


def validate_pipedream(parallel: ParallelConfig, p: int, *, compiled: bool) -> None:
    """The asynchronous schedule needs stages, and computes with stashed weight copies that
    fp16's pipeline-wide loss scale and compiled graphs would not follow."""
    if parallel.pipeline_schedule != "pipedream":
        return
    if p < 2:
        raise ValueError(
            f"parallel.pipeline_schedule=pipedream needs parallel.pipeline >= 2 (got {p}): "
            "with one stage there is nothing to run asynchronously; use 1f1b or set "
            "parallel.pipeline"
        )
    if parallel.precision == "fp16":
        raise ValueError(
            "parallel.pipeline_schedule=pipedream does not support parallel.precision=fp16: "
            "each stage updates on its own, so no loss scale is shared by the pipeline; "
            "use fp32 or bf16"
        )
    if compiled:
        raise ValueError(
            "parallel.pipeline_schedule=pipedream does not support trainer.compile=true: "
            "the blocks compute with stashed weight copies swapped in for the parameters; "
            "set trainer.compile=false or use 1f1b"
        )


def validate_replication(
    parallel: ParallelConfig, micro_batches: int, *, finetuning: bool = False
) -> None:
    """Replicated stages (parallel.pipeline_replicas, or chosen by pipeline_split=pipedream)
    exist only in the pipedream schedule, where stages share no weight and update apart; a
    stage's replicas take the step's micro-batches in turn, so their count divides them."""
    replicas, split = list(parallel.pipeline_replicas), parallel.pipeline_split
    if not replicas and split != "pipedream":
        return
    what = (
        f"parallel.pipeline_replicas={replicas}"
        if replicas
        else "parallel.pipeline_split=pipedream"
    )
    if finetuning:
        raise ValueError(f"{what}: replicated pipeline stages are for pretraining runs")
    if parallel.pipeline_schedule != "pipedream":
        raise ValueError(
            f"{what} replicates pipeline stages, which only the asynchronous schedule runs "
            f"(got parallel.pipeline_schedule={parallel.pipeline_schedule}); set "
            "parallel.pipeline_schedule=pipedream"
        )
    if parallel.pipedream_vertical_sync:
        raise ValueError(
            f"{what} does not support parallel.pipedream_vertical_sync=true: replicas of a "
            "stage count their own updates; set it to false"
        )
    if replicas and split == "pipedream":
        raise ValueError(
            f"parallel.pipeline_split=pipedream chooses the replicas itself; leave "
            f"parallel.pipeline_replicas empty (got {replicas}) or give parallel.pipeline_layers"
        )
    uneven = [n for n in replicas if micro_batches % n]
    if uneven:
        raise ValueError(
            f"{what}: a stage's replicas take the {micro_batches} micro-batches of a step "
            f"(trainer.grad_accum) in turn, so every count must divide it; {uneven} do not"
        )


def validate_recompute_granularity(parallel: ParallelConfig, num_layers: int) -> None:
    """Full recomputation's granularity must fit the model's layers."""
    if parallel.recompute != "full":
        return
    if parallel.recompute_num_layers > num_layers:
        raise ValueError(
            f"parallel.recompute_num_layers={parallel.recompute_num_layers} must be "
            f"between 0 (all) and the model's num_layers={num_layers}"
        )
    if parallel.recompute_every > num_layers:
        raise ValueError(
            f"parallel.recompute_every={parallel.recompute_every} must be between 1 "
            f"and the model's num_layers={num_layers}"
        )


def _validate_corpus(corpus: CorpusConfig, key: str, tokenizer: str) -> None:
    """The keys one corpus (data.* or an item of data.blend, named by `key`) needs."""
    if corpus.source in ("text", "jsonl") and not corpus.paths:
        raise ValueError(f"{key}source={corpus.source} needs {key}paths=[file, ...]")
    if corpus.source == "hf" and not corpus.name:
        raise ValueError(
            f"{key}source=hf needs {key}name (a hub dataset such as wikitext, or a "
            "builder such as json, parquet or arrow with data.paths=[...])"
        )
    if corpus.source == "megatron":
        if len(corpus.paths) != 1:
            raise ValueError(
                f"{key}source=megatron needs {key}paths=[prefix] (one Megatron-LM dataset: "
                f"<prefix>.bin and <prefix>.idx), got {list(corpus.paths)}; blend several "
                "with data.blend"
            )
        if not tokenizer:
            raise ValueError(
                f"{key}source=megatron holds token ids already: set data.tokenizer to the "
                "tokenizer they were written with (an HF directory or tokenizer.json, or a "
                "sentencepiece .model)"
            )
    if corpus.documents != "blank_line" and corpus.source != "text":
        raise ValueError(
            f"{key}documents={corpus.documents} applies to source=text; a {corpus.source} "
            "corpus's documents are its rows (or its index's documents)"
        )


def validate_data(data: DataConfig) -> None:
    check_choices(data, "data.")
    if not data.blend:
        _validate_corpus(data, "data.", data.tokenizer)
        return
    if data.paths:
        raise ValueError(
            f"data.blend replaces data.source and data.paths: move data.paths={list(data.paths)} "
            "into an item of data.blend"
        )
    for i, part in enumerate(data.blend):
        check_choices(part, f"data.blend[{i}].")
        if part.source == "synthetic":
            raise ValueError(f"data.blend[{i}].source=synthetic cannot be blended; pick a corpus")
        _validate_corpus(part, f"data.blend[{i}].", data.tokenizer)
    labels = [part.label for part in data.blend if part.label]
    if len(set(labels)) != len(labels):
        raise ValueError(f"data.blend labels {labels} must differ")


def validate_pair_head(model: ModelConfig, data: DataConfig) -> None:
    """BERT's pair head trains on sentence pairs; ModernBERT's recipe (pooler=head) has none."""
    if model.arch != "bert":
        return
    if model.pooler == "head" and data.sentence_pairs != "none":
        raise ValueError(
            f"model.pooler=head has no pair head to train data.sentence_pairs="
            f"{data.sentence_pairs} on: set data.sentence_pairs=none (MLM only, ModernBERT's "
            "recipe) or model.pooler=tanh"
        )
    if model.pooler == "tanh" and data.sentence_pairs == "none":
        raise ValueError(
            "data.sentence_pairs=none trains no pair head, and model.pooler=tanh's pooler and "
            "NSP head would get no gradient: set model.pooler=head, or sentence_pairs=nsp/sop"
        )


def validate_loggers(loggers: Sequence[str]) -> None:
    """A logger whose package is missing stops the run before it starts, not at the first log."""
    import importlib.util

    if "wandb" in loggers and importlib.util.find_spec("wandb") is None:
        raise ValueError(
            "trainer.loggers includes wandb, but the wandb package is not installed: "
            "pip install 'tpformer[wandb]' (or drop wandb from trainer.loggers)"
        )


def validate(config: Config, layout: Layout, *, device_type: str = "cpu") -> None:
    """Every rule of a pretraining run at `layout`, checked before the first collective;
    trainer.global_batch_size, when set, fixes trainer.grad_accum for this layout (before the
    pipeline's rules on the micro-batch count)."""
    validate_loggers(config.trainer.loggers)
    validate_model(config.model, layout.tp)
    validate_engine(config.parallel, config.optim, device_type)
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
    validate_model_layout(config.model, layout)
    validate_pair_head(config.model, config.data)
    t = config.trainer
    validate_pipeline(config.parallel, layout.pp, config.model.num_layers, t.grad_accum)
    validate_pipedream(config.parallel, layout.pp, compiled=t.compile)
    validate_replication(config.parallel, t.grad_accum)
    validate_data(config.data)


def validate_finetune(config: FinetuneConfig, layout: Layout, *, device_type: str = "cpu") -> None:
    """The rules of a fine-tuning run at `layout` that do not need its checkpoint."""
    validate_loggers(config.trainer.loggers)
    validate_engine(config.parallel, config.optim, device_type)
    validate_sequence_parallel(config.parallel, layout.tp, None)  # fine-tuning pads instead
    validate_context_parallel(layout, config.parallel, None)
    check_choices(config)
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
