"""A resumed run takes its model from its checkpoint: shape keys come from meta.json, the
compatible overrides of the command line (dropout) are applied over it and logged, and an
override equal to the checkpoint's value is no contradiction."""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from tpformer.checkpoint.source import read_model_source
from tpformer.cli.inputs import (
    adopt_checkpoint_model,
    given_model_keys,
    require_megatron_prefixes,
)
from tpformer.config.schema import Config, ModelConfig


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import transformers

    from tpformer.convert import from_hf

    root = tmp_path_factory.mktemp("ckpt")
    config = transformers.BertConfig(
        vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=64, max_position_embeddings=64, hidden_dropout_prob=0.2,
    )  # fmt: skip
    transformers.BertForPreTraining(config).save_pretrained(root / "bert")
    return from_hf(root / "bert", root / "run")


def _config(resume: str, **model: object) -> Config:
    config = Config()
    config.trainer.resume = resume
    config.model = replace(config.model, **model)
    return config


def test_the_checkpoint_gives_the_shape_and_dropout_overrides_apply(checkpoint: Path) -> None:
    saved = read_model_source(checkpoint, "trainer.resume").config
    config = _config(str(checkpoint), dropout=0.0, hidden_size=32)
    lines = adopt_checkpoint_model(
        config, ["model.dropout=0.0", "model.hidden_size=32"], Path("unused")
    )
    assert config.model == replace(saved, dropout=0.0)
    assert (saved.hidden_size, saved.num_layers, saved.dropout) == (32, 1, 0.2)
    assert lines == [
        f"model from the checkpoint {checkpoint}: bert, 1 layers, hidden 32, 2 heads, "
        "vocabulary 64",
        "model.dropout=0.0 applied over its 0.2",
    ]


def test_resume_auto_reads_the_newest_checkpoint_of_the_run(
    checkpoint: Path, tmp_path: Path
) -> None:
    config = _config("auto")
    assert adopt_checkpoint_model(config, [], tmp_path) == []  # nothing saved yet
    assert config.model == ModelConfig()
    shutil.copytree(checkpoint, tmp_path / "checkpoints" / checkpoint.name)
    assert adopt_checkpoint_model(config, [], tmp_path)
    assert config.model.hidden_size == 32


def test_given_model_keys_reads_presets_and_keys() -> None:
    assert given_model_keys(["model=gpt2_small", "++model.dropout=0", "data=text"]) == (
        "gpt2_small",
        {"dropout"},
    )


def test_fine_tuning_sets_dropout_over_its_init_and_logs_it(checkpoint: Path) -> None:
    """model.dropout / attention_dropout of tpformer-finetune replace init's (checkpoint or
    Hugging Face directory); the rest of the model comes from init."""
    from tpformer.cli.inputs import prepare_finetune
    from tpformer.config.schema import FinetuneConfig
    from tpformer.convert import load_classifier
    from tpformer.parallel.context import ParallelContext

    config = FinetuneConfig(task="sst2", init=str(checkpoint))  # type: ignore[arg-type]
    config.model.dropout = 0.0
    lines = prepare_finetune(config, [], Path("unused"))
    assert lines[1:] == ["model.dropout=0.0 applied over its 0.2"]
    for init in (checkpoint, checkpoint.parents[2] / "bert"):
        model, _ = load_classifier(
            init, ParallelContext.single(device="cpu"), num_labels=2,
            overrides=config.model.given(),
        )  # fmt: skip
        assert (model.config.dropout, model.config.attention_dropout) == (0.0, 0.1)
        assert model.config.hidden_size == 32


def test_a_megatron_source_is_checked_as_a_prefix(tmp_path: Path) -> None:
    """docs/data.md's command names the prefix Megatron's preprocessing wrote (or its .bin):
    both files beside it pass; a prefix without them is one line naming what is missing."""
    prefix = tmp_path / "my-gpt2_text_document"
    for suffix in (".bin", ".idx"):
        Path(f"{prefix}{suffix}").write_bytes(b"")
    require_megatron_prefixes([str(prefix), f"{prefix}.bin"])
    Path(f"{prefix}.idx").unlink()
    with pytest.raises(FileNotFoundError, match=r"my-gpt2_text_document.idx not found"):
        require_megatron_prefixes([str(prefix)])
