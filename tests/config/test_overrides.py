"""Override keys are checked against the schema before Hydra composes (config/overrides.py)."""

from __future__ import annotations

import pytest

from tpformer.config.overrides import check_overrides, unknown_key
from tpformer.config.schema import Config, FinetuneConfig, GenerateConfig, PlanConfig


@pytest.mark.parametrize(
    ("key", "message"),
    [
        ("parallel.tensr", "parallel.tensr is not a config key; did you mean parallel.tensor?"),
        ("paralel.tensor", "paralel.tensor is not a config key; did you mean parallel.tensor?"),
        ("trainer.max_step", "did you mean trainer.max_steps?"),
        ("parallel.zzz", "the keys of parallel are bucket_mb, context, cpu_offload"),
    ],
)
def test_an_unknown_key_names_the_closest_valid_one(key: str, message: str) -> None:
    problem = unknown_key(key, Config)
    assert problem is not None and message in problem


@pytest.mark.parametrize(
    "override",
    [
        "parallel.tensor=2",
        "model=bert_mini",
        "model.vocab_size=4000",
        "data.paths=[a.txt,b.txt]",
        "hydra.run.dir=/tmp/x",
        "hydra/job_logging=disabled",
        "--multirun",
        "~trainer.compile",
        "parallel.precision=bf16",
        # a list of records takes a list (docs/data.md's blend; once refused as a group value)
        "data.blend=[{source:text,paths:[wiki.txt],weight:0.7},{source:megatron,paths:[b]}]",
    ],
)
def test_valid_overrides_and_hydras_own_pass(override: str) -> None:
    check_overrides([override], Config)


@pytest.mark.parametrize("sweep", ["parallel.tensor=1,2", "parallel.zero_stage=1,2"])
def test_a_sweep_passes_with_multirun_and_is_explained_without(sweep: str) -> None:
    check_overrides(["--multirun", sweep], Config)
    check_overrides(["-m", sweep], Config)
    with pytest.raises(ValueError, match="Hydra reads the commas as a sweep"):
        check_overrides([sweep], Config)


def test_a_quoted_value_with_commas_and_parentheses_is_one_value() -> None:
    check_overrides(['prompt="To be, or not (to be)"'], GenerateConfig)
    with pytest.raises(ValueError, match="""quote it for the shell and Hydra: 'prompt="a \\(b"'"""):
        check_overrides(["prompt=a (b"], GenerateConfig)


@pytest.mark.parametrize(
    ("overrides", "schema", "message"),
    [
        (["+parallel.tensr=2"], Config, "did you mean parallel.tensor?"),
        (["++optim.lrr=1"], Config, "did you mean optim.lr?"),
        (["~parallel.tensr"], Config, "did you mean parallel.tensor?"),
        (["task=sst2", "trainer.epoch=1"], FinetuneConfig, "did you mean trainer.epochs?"),
        (["parallel.tensr=2"], PlanConfig, "did you mean parallel.tensor?"),
        (["parallel.zero_stage=5"], Config, "parallel.zero_stage=5 is not one of 0, 1, 2, 3"),
        (["task=sst5"], FinetuneConfig, "task=sst5 is not one of cola, sst2"),
    ],
)
def test_typos_and_added_keys_are_refused(overrides: list[str], schema: type, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("?", r"\?")):
        check_overrides(overrides, schema)
