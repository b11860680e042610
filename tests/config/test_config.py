"""Hydra composition of conf/ with the typed schema, the public key set and validation."""

import copy
import dataclasses
import functools
import re
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException
from omegaconf.errors import ConfigKeyError, ValidationError

from tpformer.cli.shell import resolve
from tpformer.config.presets import PRESETS
from tpformer.config.reference import (
    FINETUNE_GROUPS,
    PRETRAIN_GROUPS,
    config_reference_markdown,
    default_of,
    field_docstrings,
)
from tpformer.config.schema import Config, FinetuneConfig, PlanOptions
from tpformer.config.store import register_configs, to_config
from tpformer.config.validate import validate, validate_finetune

CONF = str(Path(__file__).resolve().parents[2] / "tpformer" / "conf")

PUBLIC_KEYS = {
    "model": [
        "arch",
        "attention_dropout",
        "bias",
        "classifier_pooling",
        "dropout",
        "hidden_size",
        "init_std",
        "intermediate_size",
        "local_attention",
        "max_position_embeddings",
        "mlp",
        "norm",
        "num_heads",
        "num_kv_heads",
        "num_layers",
        "pad_vocab_to",
        "pooler",
        "qkv_bias",
        "rotary",
        "tie_embeddings",
        "type_vocab_size",
        "vocab_size",
    ],
    "parallel": [
        "bucket_mb",
        "context",
        "cpu_offload",
        "data",
        "gloo_shortcuts",
        "grad_compression",
        "pipedream_update",
        "pipedream_vertical_sync",
        "pipeline",
        "pipeline_layers",
        "pipeline_replicas",
        "pipeline_schedule",
        "pipeline_split",
        "powersgd_rank",
        "powersgd_start_step",
        "precision",
        "recompute",
        "recompute_every",
        "recompute_num_layers",
        "recompute_offload",
        "rng",
        "seed",
        "sequence_parallel",
        "tensor",
        "virtual_stages",
        "zero_stage",
    ],
    "optim": [
        "base_batch_size",
        "beta1",
        "beta2",
        "clip_grad",
        "decay",
        "eps",
        "initial_loss_scale",
        "loss_scale_window",
        "lr",
        "lr_scaling",
        "max_nonfinite_steps",
        "min_lr",
        "momentum",
        "name",
        "trust_coefficient",
        "warmup_ratio",
        "warmup_steps",
        "warmup_style",
        "weight_decay",
    ],
    "data": [
        "blend",
        "cache_dir",
        "config",
        "documents",
        "eval_fraction",
        "mask_prob",
        "max_predictions_per_seq",
        "name",
        "num_workers",
        "pack",
        "paths",
        "prefetch_steps",
        "sentence_pairs",
        "seq_length",
        "short_seq_prob",
        "source",
        "split",
        "text_field",
        "tokenizer",
        "tokenizer_type",
        "whole_word_mask",
        "workers",
    ],
    "trainer": [
        "async_save",
        "compile",
        "eval_every",
        "eval_steps",
        "exit_at_step",
        "global_batch_size",
        "grad_accum",
        "keep_last",
        "log_every",
        "loggers",
        "max_steps",
        "max_time_minutes",
        "micro_batch_size",
        "peak_tflops",
        "plot",
        "profile",
        "progress",
        "resume",
        "save_every",
        "straggler_threshold",
        "verify_checkpoint",
    ],
    "launcher": ["max_restarts", "nproc_per_node", "timeout_s"],
    "cluster": [
        "calibration",
        "comm_overlap",
        "device_memory_gb",
        "dropout_ns",
        "elementwise_passes",
        "gpus_per_node",
        "host_gbps",
        "host_memory_gb",
        "host_step_gbps",
        "inter_node_gbps",
        "inter_node_latency_us",
        "intra_node_gbps",
        "intra_node_latency_us",
        "layer_overhead_us",
        "matmul_efficiency",
        "memory_gbps",
        "name",
        "nodes",
        "overhead_gb",
        "peak_tflops_16bit",
        "peak_tflops_fp32",
        "peak_tflops_fp8",
        "sm_count",
    ],
}


def compose_config(*overrides: str) -> Config:
    """The composed config (a copy: tests change it), composed once per set of overrides:
    Hydra's compose is about 0.3 s, and the key sweeps below compose the same one ~100 times."""
    return copy.deepcopy(_composed(overrides))


@functools.cache
def _composed(overrides: tuple[str, ...]) -> Config:
    register_configs()
    with initialize_config_dir(config_dir=CONF, version_base=None):
        return to_config(compose("config", overrides=list(overrides)))


def test_public_key_set_is_deliberate() -> None:
    """Adding a key is a change to this list and to its docstring in the schema, from which the
    docs' configuration reference is generated."""
    register_configs()
    with initialize_config_dir(config_dir=CONF, version_base=None):
        cfg = compose("config")
    assert {group: sorted(cfg[group]) for group in PUBLIC_KEYS} == PUBLIC_KEYS
    reference = config_reference_markdown()
    for group, keys in PUBLIC_KEYS.items():
        cls = PRETRAIN_GROUPS[group]
        docs = field_docstrings(cls)
        for key in keys:
            assert docs.get(key), f"{cls.__name__}.{key} has no docstring in config/schema/"
            row, section = f"| `{group}.{key}` |", f"| `{group}.{key}."  # trainer.profile.*
            assert row in reference or section in reference


def test_the_reference_lists_finetune_and_plan_keys() -> None:
    reference = config_reference_markdown()
    for group, cls in {**FINETUNE_GROUPS, "plan": PlanOptions}.items():
        docs = field_docstrings(cls)
        for f in dataclasses.fields(cls):
            assert docs.get(f.name), f"{cls.__name__}.{f.name} has no docstring in config/schema/"
            row, section = f"| `{group}.{f.name}` |", f"| `{group}.{f.name}."
            assert row in reference or section in reference
    assert "| `parallel.zero_stage` | 0 | `0`, `1`, `2`, `3` |" in reference
    assert "| `optim.warmup_steps` | null | int >= 0 or null |" in reference


OPTION_NAMING_KEYS = {"name", "source"}
"""What a preset file sets to say which option it is, even where that equals the default."""


@pytest.mark.parametrize("path", sorted(Path(CONF).glob("*/*.yaml")), ids=lambda p: p.stem)
def test_yaml_never_repeats_a_schema_default(path: Path) -> None:
    """The schema holds every default; a group's YAML sets only what differs (or the keys that
    name its option), so a default is written once. Read as Hydra reads it (OmegaConf's YAML:
    `1e-8` is a float, where yaml.safe_load would give the string "1e-8")."""
    from omegaconf import OmegaConf

    cls = PRETRAIN_GROUPS[path.parent.name]
    defaults = {f.name: default_of(f) for f in dataclasses.fields(cls)}
    values = OmegaConf.to_container(OmegaConf.load(path)) or {}
    assert isinstance(values, dict)
    repeated = {k: v for k, v in values.items() if k not in OPTION_NAMING_KEYS and defaults[k] == v}
    assert repeated == {}, f"{path.name} repeats the schema's defaults {repeated}"


def test_the_default_options_compose_to_the_schema_defaults() -> None:
    config = compose_config()
    for group in ("parallel", "optim", "data", "trainer", "launcher"):
        assert getattr(config, group) == PRETRAIN_GROUPS[group](), group


def test_overrides_reach_the_typed_config() -> None:
    config = compose_config(
        "model=bert_base",
        "parallel.tensor=4",
        "parallel.zero_stage=2",
        "trainer.micro_batch_size=2",
        "optim.lr=3e-4",
    )
    assert config.model == PRESETS["bert_base"]
    assert (config.parallel.tensor, config.parallel.zero_stage) == (4, 2)
    assert config.trainer.micro_batch_size == 2 and config.optim.lr == 3e-4
    assert isinstance(config, Config)


@pytest.mark.parametrize(
    ("override", "error"),
    [
        ("parallel.tensr=2", ConfigCompositionException),
        ("parallel.seed=two", ConfigCompositionException),
        ("model=bert_huge", ConfigCompositionException),
        ("data=wiki", ConfigCompositionException),
    ],
)
def test_typos_and_wrong_types_fail_in_hydra(override: str, error: type) -> None:
    with pytest.raises(error) as info:
        compose_config(override)
    cause = info.value.__cause__ or info.value
    assert isinstance(
        cause, (ConfigKeyError, ValidationError, ConfigCompositionException, Exception)
    )
    if override.startswith("model="):
        assert "bert_huge" in str(info.value) and "bert_base" in str(info.value)


CHOICES = {
    "parallel.zero_stage": "0, 1, 2, 3",
    "parallel.precision": "fp32, bf16, fp16, fp8",
    "parallel.cpu_offload": "none, optimizer, optimizer+params",
    "parallel.recompute": "none, selective, full",
    "parallel.grad_compression": "none, bf16, powersgd",
    "parallel.pipeline_schedule": "gpipe, 1f1b, interleaved_1f1b, pipedream",
    "parallel.pipeline_split": "balanced, profile, pipedream",
    "parallel.pipedream_update": "micro_batch, step",
    "optim.name": "adamw, lamb, lars, novograd",
    "optim.decay": "linear, cosine",
    "optim.lr_scaling": "none, linear, sqrt",
    "model.arch": "bert, gpt",
    "model.mlp.activation": "gelu, gelu_tanh, silu",
    "model.norm.kind": "layernorm, rmsnorm",
    "model.norm.position": "post, pre",
    "model.rotary.scaling": "none, linear, dynamic, llama3",
    "model.pooler": "tanh, head",
    "model.classifier_pooling": "cls, mean",
    "data.source": "shakespeare, text, jsonl, hf, megatron, synthetic",
    "data.documents": "blank_line, file, line",
    "data.tokenizer_type": "bpe, unigram",
    "data.sentence_pairs": "auto, nsp, sop, none",
}


@pytest.mark.sweep
@pytest.mark.parametrize("key", sorted(CHOICES))
def test_every_choice_key_names_its_allowed_values(key: str) -> None:
    """Declared beside the field (an Enum in config/schema/choices.py): Hydra rejects the value
    while composing; the one validator says the same for configs built in code."""
    held = ["model=llama_tiny"] if key.startswith("model.rotary.") else []  # a variant group
    with pytest.raises(ConfigCompositionException) as info:
        compose_config(*held, f"{key}=bogus")
    message = str(info.value.__cause__ or info.value)
    assert f"Invalid value 'bogus', expected one of [{CHOICES[key]}]" in message, message
    config = compose_config(*held)
    *groups, name = key.split(".")
    setattr(functools.reduce(getattr, groups, config), name, "bogus")
    with pytest.raises(ValueError, match=rf"{key}='bogus' is not one of \["):
        validate(config, resolve(config, 1))


def _ranged_keys(config: object, prefix: str = "") -> list[tuple[str, object]]:
    keys = []
    for f in dataclasses.fields(config):  # type: ignore[arg-type]
        value = getattr(config, f.name)
        if dataclasses.is_dataclass(value):
            keys += _ranged_keys(value, f"{prefix}{f.name}.")
        elif "range" in f.metadata:
            keys.append((prefix + f.name, f.metadata["range"]))
    return keys


def _outside(bounds: object) -> float:
    lo, lo_open = bounds.lo, bounds.lo_open  # type: ignore[attr-defined]
    return lo if lo_open else lo - 1


@pytest.mark.sweep
@pytest.mark.parametrize("key", [k for k, _ in _ranged_keys(Config())])
def test_every_numeric_pretraining_key_has_a_checked_range(key: str) -> None:
    config = compose_config()
    bounds = dict(_ranged_keys(config))[key]
    group, name = key.rsplit(".", 1)
    setattr(functools.reduce(getattr, group.split("."), config), name, _outside(bounds))
    with pytest.raises(
        ValueError, match=rf"^{re.escape(key)}=\S+ must be {re.escape(str(bounds))}"
    ):
        validate(config, resolve(config, 1))


@pytest.mark.parametrize(
    "key",
    [
        k
        for k, _ in _ranged_keys(FinetuneConfig(task="rte", init="x"))
        if k.startswith(("trainer.", "data."))
    ],
)
def test_every_numeric_finetuning_key_has_a_checked_range(key: str) -> None:
    config = FinetuneConfig(task="rte", init="x")
    bounds = dict(_ranged_keys(config))[key]
    group, name = key.rsplit(".", 1)
    setattr(functools.reduce(getattr, group.split("."), config), name, _outside(bounds))
    with pytest.raises(
        ValueError, match=rf"^{re.escape(key)}=\S+ must be {re.escape(str(bounds))}"
    ):
        validate_finetune(config, resolve(config, 1))


def test_corpus_groups_need_their_files_or_name() -> None:
    with pytest.raises(ValueError, match=r"data.source=text needs data.paths=\[file, ...\]"):
        validate(compose_config("data=text"), resolve(compose_config(), 1))
    with pytest.raises(ValueError, match=r"data.source=hf needs data.name"):
        validate(compose_config("data=hf"), resolve(compose_config(), 1))
    config = compose_config("data=jsonl", "data.paths=[a.jsonl]", "data.text_field=body")
    assert (config.data.source, config.data.paths, config.data.text_field) == (
        "jsonl",
        ["a.jsonl"],
        "body",
    )
    validate(config, resolve(config, 1))


@pytest.mark.parametrize(
    ("overrides", "world", "message"),
    [
        (
            ["model=bert_base", "parallel.tensor=5"],
            5,
            r"parallel.tensor=5 must divide model.num_heads=12",
        ),
        (["parallel.tensor=3"], 4, r"parallel.tensor=3 does not divide world_size=4"),
        (
            ["parallel.data=3"],
            4,
            r"parallel.data=3 x parallel.tensor=1 = 3 must equal world_size=4",
        ),
        (["trainer.micro_batch_size=0"], 1, r"trainer.micro_batch_size=0 must be >= 1"),
        (["trainer.grad_accum=0"], 1, r"trainer.grad_accum=0 must be >= 1"),
        (["trainer.log_every=0"], 1, r"trainer.log_every=0 must be >= 1"),
        (["trainer.eval_steps=0"], 1, r"trainer.eval_steps=0 must be >= 1"),
        (["optim.min_lr=1e-3", "optim.lr=1e-4"], 1, r"optim.min_lr=0.001 must not exceed optim.lr"),
        (["parallel.precision=fp16"], 1, r"parallel.precision=fp16 needs a GPU"),
        (
            ["data.seq_length=1024"],
            1,
            r"data.seq_length=1024 exceeds model.max_position_embeddings=512",
        ),
        (["data.mask_prob=1.5"], 1, r"data.mask_prob=1.5 must be in \(0, 1\)"),
    ],
)
def test_invalid_values_are_rejected_with_the_value(
    overrides: list[str], world: int, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        config = compose_config(*overrides)
        validate(config, resolve(config, world), device_type="cpu")


CONFIG_ERRORS = [
    (
        "tpformer.cli.pretrain",
        "parallel.precision=fp4",
        "error: parallel.precision=fp4 is not one of fp32, bf16, fp16, fp8",
    ),
    (
        "tpformer.cli.pretrain",
        "parallel.tensr=2",
        "error: parallel.tensr is not a config key; did you mean parallel.tensor?",
    ),
    ("tpformer.cli.pretrain", "trainer.log_every=0", "trainer.log_every=0 must be >= 1"),
    ("tpformer.cli.finetune", "trainer.epochs=0", "trainer.epochs=0.0 must be > 0"),
    (
        "tpformer.cli.finetune",
        "trainer.max_steps=10",
        "error: trainer.max_steps is not a config key; the keys of trainer are async_save, ",
    ),
    (
        "tpformer.cli.finetune",
        "data.seq_length=64",
        "error: data.seq_length is not a config key; did you mean data.max_length?",
    ),
]


def _config_error_argv(module: str, override: str) -> list[str]:
    return [override, "task=sst2", "init={cwd}"] if module.endswith("finetune") else [override]


@pytest.mark.parametrize(("module", "override", "message"), CONFIG_ERRORS)
@pytest.mark.slow
def test_config_errors_exit_2_before_any_process(
    module: str, override: str, message: str, request: pytest.FixtureRequest
) -> None:
    """A pretraining-only key has no meaning in fine-tuning and is rejected there, like a typo
    or a value outside a key's choices: exit code 2 and Hydra's one-line message."""
    from tests.cli.in_process import outcome, selected_cases

    cases = [c for c in selected_cases(request) if c["module"] == module]
    table = [_config_error_argv(module, c["override"]) for c in cases]
    result = outcome(f"{module}:main", _config_error_argv(module, override), table, request)
    assert result.code == 2, result.stderr[-2000:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0] and not result.left, result
