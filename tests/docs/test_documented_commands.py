"""The documented commands no other test runs, run as the docs give them (issue 68): each case
takes its command from the page (`documented`), in a working directory holding the files the
command names (written here at tiny sizes: books.txt, corpus.jsonl, Parquet and Arrow shards,
my_conf/, a WordPiece tokenizer in hf/bert-base-uncased, a Hugging Face BERT in path/to/bert,
GLUE files in glue/), appends SIZES for what the command leaves to its defaults, and states in
`replace` what it changes of what the command sets. Each case checks its exit code and a fact
of its output or its files. One process runs a table (tests/cli/bad_input_cases.py's runner)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.data.common import write_corpus
from tests.data.test_glue import write_glue_file
from tests.docs.commands import documented
from tests.docs.runs import (
    FINETUNE_SIZES,
    MODEL_SIZES,
    SIZES,
    DocumentedRun,
    exists,
    has,
    run_table,
    trained,
)
from tests.train.test_finetune import WORDS, sentiment_rows, write_hf_bert, write_sst2

pytestmark = pytest.mark.slow  # console-script runs


def _hf_tokenizer(directory: Path) -> int:
    from transformers import BertTokenizerFast

    directory.mkdir(parents=True)
    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS, *"abcdefghijklmnopqrstuvwxyz"]
    vocab = list(dict.fromkeys(words))
    (directory / "vocab.txt").write_text("\n".join(vocab) + "\n")
    BertTokenizerFast(str(directory / "vocab.txt")).save_pretrained(directory)
    return len(vocab)


def _write_inputs(cwd: Path) -> dict[str, int]:
    """The files the documented commands name, at tiny sizes."""
    from datasets import Dataset

    for name, seed in (("books.txt", 0), ("news.txt", 1)):
        write_corpus(cwd / name, documents=12, seed=seed)
    texts = (cwd / "books.txt").read_text().split("\n\n")
    with (cwd / "corpus.jsonl").open("w") as out:
        out.writelines(json.dumps({"body": text}) + "\n" for text in texts)
    rows = Dataset.from_dict({"text": texts})
    rows.to_parquet(cwd / "shard0.parquet")
    for i in range(2):
        rows.shard(2, i).to_parquet(cwd / f"shard-0000{i}.parquet")
    rows.save_to_disk(cwd / "saved")
    (cwd / "my_conf" / "parallel").mkdir(parents=True)
    (cwd / "my_conf" / "parallel" / "mine.yaml").write_text("zero_stage: 1\n")
    write_hf_bert(cwd / "path" / "to" / "bert", num_heads=8)
    write_sst2(cwd / "glue", train=32, dev=16)
    return {"wordpiece": _hf_tokenizer(cwd / "hf" / "bert-base-uncased")}


def _cases(vocab: dict[str, int]) -> list[DocumentedRun]:
    one_epoch = ("trainer.epochs=1", "trainer.batch_size=8")
    return [
        # docs/configuration.md
        DocumentedRun(
            "tpformer-pretrain --cfg job",
            has("hidden_size: 768", "num_layers: 12"),
            sizes=(),
            hydra=False,
        ),
        DocumentedRun("tpformer-pretrain --config-dir my_conf", has("zero_stage 1")),
        DocumentedRun(
            "tpformer-preprocess data=text",
            has("corpus cache/corpus-"),
            replace={"model.vocab_size=16000": "model.vocab_size=200", "workers=8": "workers=2"},
            sizes=(SIZES[5], "data.cache_dir=cache"),
        ),
        DocumentedRun(
            "tpformer-pretrain data=text data.paths=[books.txt",
            trained(2),
            replace={"model.vocab_size=16000": "model.vocab_size=200"},
        ),
        DocumentedRun("tpformer-pretrain data=jsonl", trained(2)),
        DocumentedRun("tpformer-pretrain data=hf data.name=parquet data.paths=[shard0", trained(2)),
        DocumentedRun(
            "tpformer-pretrain data.tokenizer=hf/bert-base-uncased",
            trained(2),
            replace={"model.vocab_size=30522": f"model.vocab_size={vocab['wordpiece']}"},
        ),
        DocumentedRun("tpformer-pretrain data.num_workers=8", trained(2), replace={"=8": "=2"}),
        DocumentedRun("tpformer-pretrain data.num_workers=0", trained(2)),
        # docs/data.md
        DocumentedRun(
            "tpformer-pretrain data=hf data.name=parquet 'data.paths=[shard-", trained(2)
        ),
        DocumentedRun("tpformer-pretrain data=hf data.name=arrow", trained(2)),
        # docs/parallel/offload.md
        DocumentedRun("tpformer-pretrain model=bert_large parallel.zero_stage=2", trained(2)),
        DocumentedRun("tpformer-pretrain model=bert_large parallel.zero_stage=3", trained(2)),
        DocumentedRun("tpformer-pretrain model=bert_large parallel.recompute=full", trained(2)),
        # docs/optimizers.md
        DocumentedRun("tpformer-pretrain ... optim.name=lamb", trained(2)),
        DocumentedRun("tpformer-pretrain ... optim.name=lars", trained(2)),
        DocumentedRun("tpformer-pretrain ... optim.name=novograd", trained(2)),
        # docs/logging.md: offline, nothing leaves the machine
        DocumentedRun("WANDB_MODE=offline", exists("{run}/wandb/offline-run-*/run-*.wandb")),
        # docs/checkpoints.md, then docs/hf.md on its checkpoint
        DocumentedRun(
            "tpformer-pretrain trainer.save_every=100",
            exists("runs/bert/checkpoints/step00000002"),
            replace={"save_every=100": "save_every=2"},
        ),
        DocumentedRun(
            "tpformer-pretrain trainer.resume=auto hydra.run.dir=runs/bert",
            has("done: step 4"),
            extra=("trainer.max_steps=4",),
        ),
        DocumentedRun(
            "tpformer-pretrain trainer.exit_at_step=500",
            exists("runs/stop/checkpoints/step00000001"),
            replace={"exit_at_step=500": "exit_at_step=1", "runs/bert": "runs/stop"},
        ),
        DocumentedRun(
            "tpformer-convert to-hf runs/bert/checkpoints/step00000300",
            exists("hf/bert/config.json", "hf/bert/model.safetensors"),
            replace={"step00000300": "step00000002"},
            sizes=(),
            hydra=False,
        ),
        DocumentedRun(  # README's, into a directory of its own
            "tpformer-convert to-hf runs/bert/checkpoints/step00000600",
            exists("hf/bert-readme/config.json"),
            replace={"step00000600": "step00000002", " hf/bert": " hf/bert-readme"},
            sizes=(),
            hydra=False,
        ),
        DocumentedRun(
            "tpformer-convert from-hf hf/bert",
            exists("runs/warm/checkpoints"),
            sizes=(),
            hydra=False,
        ),
        DocumentedRun("tpformer-pretrain trainer.resume=runs/warm", trained(2)),
        # README's dry runs and docs/finetuning.md's
        DocumentedRun(
            "tpformer-plan ... plan.dry_run=true", has("dry run"), sizes=tuple(MODEL_SIZES)
        ),
        DocumentedRun(
            "tpformer-finetune ... dry_run.world=N",
            has("rank 0"),
            replace={"dry_run.world=N": "dry_run.world=2"},
            extra=("task=sst2", "init=path/to/bert", "data.glue_dir=glue", *one_epoch),
            sizes=FINETUNE_SIZES,
        ),
        DocumentedRun(
            "tpformer-finetune task=sst2 init=path/to/bert data.glue_dir=glue parallel.tensor=8",
            has("rank 0"),
            extra=one_epoch,
            sizes=FINETUNE_SIZES,
        ),
    ]


def test_the_documented_commands_run_at_tiny_sizes(tmp_path: Path) -> None:
    run_table(tmp_path, _cases(_write_inputs(tmp_path)))


MAIN_JOB = documented("tpformer-pretrain model=bert_mini model.vocab_size=4000 parallel.tensor=2")
MAIN_JOB_SIZES = {  # the main job shrunk: what the chain below changes of its overrides
    "model.vocab_size=4000": "model.vocab_size=200",
    "trainer.micro_batch_size=32": "trainer.micro_batch_size=4",
    "trainer.max_steps=1200": "trainer.max_steps=4",
    "trainer.eval_every=200": "trainer.eval_every=2",
    "trainer.save_every=600": "trainer.save_every=2",
}
STEP = "step00000004"  # the main job's last checkpoint here (step 1200 in the docs)


def _main_job_overrides() -> str:
    overrides = MAIN_JOB.removeprefix("tpformer-pretrain ")
    for documented_text, here in MAIN_JOB_SIZES.items():
        overrides = overrides.replace(documented_text, here)
    return overrides


def _chains() -> list[DocumentedRun]:
    """The main job stopped and resumed, exported and fine-tuned (examples/bert_pretrain), and
    configuration.md's TP=4 with ZeRO-2 on 4 ranks. (docs/generation.md's walkthrough runs in
    tests/inference/test_cli.py, the SST-2 fine-tune at TP=2 in tests/train/test_finetune.py,
    README's laptop layout in tests/train/test_trainer.py, each against a reference.)"""
    main = {"<overrides>": _main_job_overrides()}
    one_epoch = ("trainer.epochs=1", "trainer.batch_size=8")
    return [
        DocumentedRun(
            "tpformer-preprocess model=bert_mini",
            has("corpus cache/corpus-"),
            replace={"model.vocab_size=4000": "model.vocab_size=200"},
            sizes=("data.cache_dir=cache",),
        ),
        DocumentedRun(
            "tpformer-pretrain <overrides> trainer.exit_at_step=600",
            exists("runs/bert_mini_shakespeare/checkpoints/step00000002"),
            replace={**main, "exit_at_step=600": "exit_at_step=2"},
        ),
        DocumentedRun(
            "tpformer-pretrain <overrides> trainer.resume=auto",
            exists(f"runs/bert_mini_shakespeare/checkpoints/{STEP}"),
            replace=main,
        ),
        DocumentedRun(
            "tpformer-convert to-hf runs/bert_mini_shakespeare",
            exists("runs/bert_mini_shakespeare/hf/config.json"),
            replace={"step00001200": STEP},
            sizes=(),
            hydra=False,
        ),
        DocumentedRun(
            "tpformer-finetune task=rte init=runs/bert_mini_shakespeare/checkpoints/step00001200",
            has("best"),
            replace={"step00001200": STEP},
            extra=one_epoch,
            sizes=FINETUNE_SIZES,
        ),
        DocumentedRun(
            "tpformer-finetune task=rte init=runs/bert_mini_shakespeare/checkpoints/step00000500",
            has("best"),
            replace={"step00000500": STEP},
            extra=one_epoch,
            sizes=FINETUNE_SIZES,
        ),
        DocumentedRun(  # docs/configuration.md's first command
            "tpformer-pretrain model=bert_base parallel.tensor=4 parallel.zero_stage=2",
            exists("{run}/metrics.jsonl"),
            sizes=(*SIZES[:2], "model.num_heads=4", *SIZES[3:]),
        ),
    ]


def test_the_documented_jobs_run_end_to_end_at_tiny_sizes(tmp_path: Path) -> None:
    assert documented("pip install torch==2.13.0 && pip install -e '.[demo]' && tpformer").endswith(
        " && " + MAIN_JOB
    )  # README's first command is the main job's
    _write_inputs(tmp_path)
    write_glue_file(tmp_path / "glue", "RTE", "train", _pairs(32, 1))
    write_glue_file(tmp_path / "glue", "RTE", "dev", _pairs(16, 2))
    run_table(tmp_path, _chains())


def _pairs(n: int, seed: int) -> list[tuple[str, str, str]]:
    labels = ["entailment", "not_entailment"]
    return [(a, a, labels[int(label)]) for a, _, label in sentiment_rows(n, seed)]
