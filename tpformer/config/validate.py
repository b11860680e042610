"""Cross-field checks that run before any collective, each naming the value and what is valid."""

from __future__ import annotations

from tpformer.config.schema import Config, DataConfig, FinetuneConfig, ModelConfig, OptimConfig
from tpformer.parallel.layout import divisors, resolve_layout

DATA_SOURCES = ("shakespeare", "text", "jsonl", "hf", "synthetic")

ARCHS = ("bert", "gpt")
OFFLOAD_MODES = ("none", "optimizer", "optimizer+params")
OPTIMIZERS = ("adamw", "lamb")
PRECISIONS = ("fp32", "bf16", "fp16")
CHECKPOINTING = ("none", "selective", "full")
ACTIVATIONS = ("gelu", "gelu_tanh")


def validate_model(model: ModelConfig, tp: int) -> None:
    """Raise ValueError if `model` cannot be built or cannot be split over `tp` ranks."""
    if model.arch not in ARCHS:
        raise ValueError(f"model.arch={model.arch!r} is not one of {list(ARCHS)}")
    if model.activation not in ACTIVATIONS:
        raise ValueError(f"model.activation={model.activation!r} is not one of {list(ACTIVATIONS)}")
    if model.hidden_size % model.num_heads != 0:
        raise ValueError(
            f"model.hidden_size={model.hidden_size} is not divisible by "
            f"model.num_heads={model.num_heads}; valid head counts are {divisors(model.hidden_size)}"
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
    for name in ("dropout", "attention_dropout"):
        p = getattr(model, name)
        if not 0.0 <= p < 1.0:
            raise ValueError(f"model.{name}={p} must be in [0, 1)")


def validate_engine(optim: OptimConfig, zero_stage: int, cpu_offload: str) -> None:
    """Reject bad engine settings before any buffer or collective exists."""
    if zero_stage not in (0, 1, 2, 3):
        raise ValueError(f"parallel.zero_stage={zero_stage} must be 0, 1, 2 or 3")
    if cpu_offload not in OFFLOAD_MODES:
        raise ValueError(f"parallel.cpu_offload={cpu_offload!r} is not one of {list(OFFLOAD_MODES)}")
    if cpu_offload == "optimizer+params" and zero_stage != 3:
        raise ValueError(f"parallel.cpu_offload=optimizer+params needs parallel.zero_stage=3 "
                         f"(got {zero_stage}): only stage 3 keeps parameter partitions")
    if optim.name not in OPTIMIZERS:
        where = " that can step on the CPU" if cpu_offload != "none" else ""
        raise ValueError(f"optim.name={optim.name!r} is not an optimizer{where} tpformer has; "
                         f"valid: {list(OPTIMIZERS)}")


def validate_precision(precision: str, device_type: str) -> None:
    if precision not in PRECISIONS:
        raise ValueError(f"parallel.precision={precision!r} is not one of {list(PRECISIONS)}")
    if precision == "fp16" and device_type == "cpu":
        raise ValueError("parallel.precision=fp16 needs a GPU: CPU kernels for half precision are "
                         "slow or missing; use parallel.precision=bf16 or fp32 on CPU")


def validate_data(data: DataConfig) -> None:
    choices = {"source": DATA_SOURCES, "sentence_pairs": ("nsp", "sop"),
               "tokenizer_type": ("bpe", "unigram")}
    for key, allowed in choices.items():
        if getattr(data, key) not in allowed:
            raise ValueError(f"data.{key}={getattr(data, key)!r} is not one of {list(allowed)}")
    if data.source in ("text", "jsonl") and not data.paths:
        raise ValueError(f"data.source={data.source} needs data.paths=[file, ...]")
    if data.source == "hf" and not data.name:
        raise ValueError("data.source=hf needs data.name (a hub dataset such as wikitext, or a "
                         "builder such as json, parquet or text with data.paths=[...])")
    if not 0 < data.mask_prob < 1:
        raise ValueError(f"data.mask_prob={data.mask_prob} must be in (0, 1)")
    if not 0 <= data.eval_fraction < 1:
        raise ValueError(f"data.eval_fraction={data.eval_fraction} must be in [0, 1)")
    if data.workers < 1:
        raise ValueError(f"data.workers={data.workers} must be >= 1")


def validate(config: Config, world_size: int, *, device_type: str = "cpu") -> None:
    """Every cross-field rule of a run, checked before the first collective."""
    resolve_layout(config.parallel.tensor, config.parallel.data, world_size)
    validate_model(config.model, config.parallel.tensor)
    parallel = config.parallel
    validate_engine(config.optim, parallel.zero_stage, parallel.cpu_offload)
    validate_precision(parallel.precision, device_type)
    if parallel.activation_checkpointing not in CHECKPOINTING:
        raise ValueError(f"parallel.activation_checkpointing={parallel.activation_checkpointing!r} "
                         f"is not one of {list(CHECKPOINTING)}")
    trainer = config.trainer
    for name in ("micro_batch_size", "grad_accum", "max_steps"):
        if getattr(trainer, name) < 1:
            raise ValueError(f"trainer.{name}={getattr(trainer, name)} must be >= 1")
    if config.data.seq_length > config.model.max_position_embeddings:
        raise ValueError(f"data.seq_length={config.data.seq_length} exceeds "
                         f"model.max_position_embeddings={config.model.max_position_embeddings}")
    validate_data(config.data)
    if config.optim.decay not in ("linear", "cosine"):
        raise ValueError(f"optim.decay={config.optim.decay!r} is not one of ['linear', 'cosine']")
    if config.optim.lr_scaling not in ("none", "linear", "sqrt"):
        raise ValueError(f"optim.lr_scaling={config.optim.lr_scaling!r} is not one of "
                         "['none', 'linear', 'sqrt']")


GLUE_TASKS = ("cola", "sst2", "mrpc", "stsb", "qqp", "mnli", "qnli", "rte", "wnli")


def validate_finetune(config: FinetuneConfig, world_size: int, *, device_type: str = "cpu") -> None:
    """The rules of a fine-tuning run that do not need its checkpoint."""
    layout = resolve_layout(config.parallel.tensor, config.parallel.data, world_size)
    validate_engine(config.optim, config.parallel.zero_stage, config.parallel.cpu_offload)
    validate_precision(config.parallel.precision, device_type)
    if config.task not in GLUE_TASKS:
        raise ValueError(f"task={config.task!r} is not a GLUE task; use one of {sorted(GLUE_TASKS)}")
    t = config.trainer
    micro = t.micro_batch_size or t.batch_size // layout.dp
    if t.batch_size < 1 or micro < 1 or t.batch_size % (micro * layout.dp):
        raise ValueError(f"trainer.batch_size={t.batch_size} must be a multiple of "
                         f"trainer.micro_batch_size={micro} x dp={layout.dp}")
    if t.epochs <= 0:
        raise ValueError(f"trainer.epochs={t.epochs} must be > 0")
    if not 8 <= config.data.max_length <= 512:
        raise ValueError(f"data.max_length={config.data.max_length} must be in [8, 512]")
