"""The inputs each console script reads, checked before any process starts or any run
directory is kept (bad input exits 2 in one line naming the key): files and directories exist,
`init=` names a checkpoint or Hugging Face directory of the architecture the job needs, and a
resumed pretraining run takes its model config from its checkpoint (as `from_pretrained` and
Megatron-LM's --use-checkpoint-args do), so no `model.*` override has to repeat it and none may
contradict it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import fields, replace
from pathlib import Path

from tpformer.checkpoint import store
from tpformer.checkpoint.source import ModelSource, read_model_source, require_arch
from tpformer.config.families import family_of
from tpformer.config.rules.model import validate_fp8, validate_model
from tpformer.config.schema import (
    Arch,
    Config,
    EvalLMConfig,
    FinetuneConfig,
    GenerateConfig,
    ModelConfig,
)
from tpformer.data.glue.tasks import split_file
from tpformer.data.megatron_indexed import megatron_prefix
from tpformer.inference.text import has_tokenizer

COMPATIBLE_KEYS = ("dropout", "attention_dropout", "init_std")
"""Model keys a resumed run may change over its checkpoint's: they shape no parameter, and a
loaded model is not initialized."""


def given_model_keys(overrides: Sequence[str]) -> tuple[str | None, set[str]]:
    """(the preset named by model=..., the model keys or groups named by model.KEY=... or
    model.GROUP.KEY=...) on the command line."""
    preset, keys = None, set()
    for override in overrides:
        key, _, value = override.lstrip("+~").partition("=")
        if key == "model":
            preset = value
        elif key.startswith("model."):
            keys.add(key.removeprefix("model.").split(".")[0])
    return preset, keys


def resumed_checkpoint(config: Config, run_dir: Path) -> Path | None:
    """The checkpoint trainer.resume names: a directory, or with auto the newest of run_dir."""
    choice = config.trainer.resume
    if choice == "none":
        return None
    if choice == "auto":
        return store.newest_checkpoint(run_dir / store.CHECKPOINTS)
    return read_model_source(choice, "trainer.resume", hub=False).path


def adopt_checkpoint_model(config: Config, overrides: Sequence[str], run_dir: Path) -> list[str]:
    """Give a resumed run its checkpoint's model config, with the compatible model.* overrides
    of the command line applied over it; an override that contradicts it is refused by name.
    Returns the lines to log."""
    directory = resumed_checkpoint(config, run_dir)
    if directory is None:
        return []
    auto = config.trainer.resume == "auto"
    saved = read_model_source(directory, "trainer.resume", whole=not auto, hub=False).config
    preset, keys = given_model_keys(overrides)
    run = config.model
    differ = [
        f.name
        for f in fields(ModelConfig)
        if getattr(run, f.name) != getattr(saved, f.name) and f.name not in COMPATIBLE_KEYS
    ]
    source = f"the checkpoint trainer.resume={config.trainer.resume} ({directory})"
    explicit = [k for k in differ if k in keys]
    if explicit:
        named = ", ".join(f"model.{k}={getattr(run, k)}" for k in explicit)
        held = ", ".join(f"{k}={getattr(saved, k)}" for k in explicit)
        raise ValueError(
            f"{named} contradicts {source}, which holds {held}: a resumed run takes its model "
            "from its checkpoint; drop the override"
        )
    if preset is not None and differ:
        held = ", ".join(f"{k}={getattr(saved, k)} (preset {getattr(run, k)})" for k in differ)
        raise ValueError(
            f"model={preset} contradicts {source}, which holds {held}: a resumed run takes its "
            f"model from its checkpoint; drop model={preset}"
        )
    applied = {k: getattr(run, k) for k in COMPATIBLE_KEYS if k in keys}
    config.model = replace(saved, **applied)
    lines = [f"model from the checkpoint {directory}: {describe(saved)}"]
    lines += [f"model.{k}={v} applied over its {getattr(saved, k)}" for k, v in applied.items()]
    return lines


def describe(model: ModelConfig) -> str:
    return (
        f"{family_of(model).name}, {model.num_layers} layers, hidden {model.hidden_size}, "
        f"{model.num_heads} heads, vocabulary {model.vocab_size}"
    )


def require_paths(**given: str | Sequence[str]) -> None:
    """Each non-empty path given (key=path or key=[paths], dots in keys written as __) exists;
    FileNotFoundError naming the key and the path otherwise."""
    for key, value in given.items():
        for path in [value] if isinstance(value, str) else value:
            if path and not Path(path).expanduser().exists():
                name = key.replace("__", ".")
                raise FileNotFoundError(f"{name}={path}: no such file or directory")


def require_megatron_prefixes(paths: Sequence[str]) -> None:
    """Each of data.paths (data.source=megatron) names a Megatron dataset: a prefix, or its
    .bin or .idx file, with both files beside it; FileNotFoundError naming the path otherwise."""
    for path in paths:
        prefix = megatron_prefix(path)
        missing = [f"{prefix}{s}" for s in (".bin", ".idx") if not Path(f"{prefix}{s}").is_file()]
        if missing:
            raise FileNotFoundError(
                f"data.paths={path}: no Megatron dataset there ({' and '.join(missing)} not "
                "found); give the prefix Megatron's preprocessing wrote (PREFIX.bin, PREFIX.idx)"
            )


def prepare_pretrain(config: Config, overrides: Sequence[str], run_dir: Path) -> list[str]:
    megatron = config.data.source == "megatron"
    require_paths(data__paths=[] if megatron else config.data.paths)
    require_megatron_prefixes(config.data.paths if megatron else [])
    require_paths(data__tokenizer=config.data.tokenizer)
    return adopt_checkpoint_model(config, overrides, run_dir)


def prepare_finetune(config: FinetuneConfig, overrides: Sequence[str], run_dir: Path) -> list[str]:
    d = config.data
    require_paths(
        data__glue_dir=d.glue_dir,
        data__train_file=d.train_file,
        data__dev_file=d.dev_file,
        data__test_file=d.test_file,
    )
    if d.glue_dir and not d.train_file:
        split_file(d.glue_dir, config.task, "train")
    source = read_model_source(config.init, "init")
    require_arch(source, Arch.bert, "init", "fine-tuning")
    require_split(source, config.parallel.tensor, fp8=config.parallel.precision == "fp8")
    given = config.model.given()  # its range was checked with every other key's
    lines = [f"model from the {source.kind} {source.path}: {describe(source.config)}"]
    return lines + [
        f"model.{k}={v} applied over its {getattr(source.config, k)}" for k, v in given.items()
    ]


def prepare_generate(config: GenerateConfig, overrides: Sequence[str], run_dir: Path) -> list[str]:
    require_paths(prompts=config.prompts)
    source = require_arch(read_model_source(config.init, "init"), Arch.gpt, "init", "generation")
    require_split(source, config.parallel.tensor)
    text = "prompt" if config.prompt else "prompts" if not config.prompts.endswith(".jsonl") else ""
    require_tokenizer(source, text)
    return []


def prepare_eval_lm(config: EvalLMConfig, overrides: Sequence[str], run_dir: Path) -> list[str]:
    require_paths(data_file=config.data_file)
    init = read_model_source(config.init, "init")
    source = require_arch(init, Arch.gpt, "init", "tpformer-eval-lm")
    require_split(source, config.parallel.tensor)
    require_tokenizer(source, "" if config.data_file.endswith(".jsonl") else "data_file")
    return []


def require_split(source: ModelSource, tensor: int | str, *, fp8: bool = False) -> None:
    """The init model splits over parallel.tensor (its heads, key/value heads and FFN width;
    with `fp8`, widths fp8 matmuls take), checked before any rank starts: one line naming the
    degree, the model and the valid degrees, instead of every rank failing as it builds the
    model."""
    if isinstance(tensor, int):
        try:
            validate_model(source.config, tensor)
            if fp8:
                validate_fp8(source.config, tensor)
        except ValueError as err:
            raise ValueError(f"{err} (the model of init={source.path})") from None


def require_tokenizer(source: ModelSource, text_key: str) -> None:
    """A text input (named by text_key; "" for none) needs the model's tokenizer."""
    if text_key and not has_tokenizer(source.tokenizer_dir):
        raise ValueError(
            f"{text_key} is text, and init={source.path} has no tokenizer (no tokenizer/ in a "
            "tpformer checkpoint, no tokenizer files beside a Hugging Face config.json): give "
            f'token ids instead, as a JSONL file with "input_ids" per line'
        )
