"""The documented commands no other test runs, run as the docs give them (issue 68): each case
takes its command from the page (`documented`), in a working directory holding the files the
command names (written here at tiny sizes: books.txt, corpus.jsonl, Parquet and Arrow shards,
my_conf/, a WordPiece tokenizer in hf/bert-base-uncased, a Hugging Face BERT in path/to/bert,
GLUE files in glue/), appends SIZES for what the command leaves to its defaults, and states in
`replace` what it changes of what the command sets. Each case checks its exit code and a fact
of its output or its files. One process runs a table (tests/cli/bad_input_cases.py's runner)."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.cli.bad_input_cases import run_cases
from tests.data.common import write_corpus
from tests.docs.commands import arguments, documented, with_sizes
from tests.train.test_finetune import WORDS, write_hf_bert, write_sst2
from tests.train.test_trainer import QUIET

pytestmark = pytest.mark.slow  # console-script runs

SCRIPTS = {
    "tpformer-pretrain": "tpformer.cli.pretrain:main",
    "tpformer-finetune": "tpformer.cli.finetune:main",
    "tpformer-plan": "tpformer.cli.plan:main",
    "tpformer-preprocess": "tpformer.cli.data:preprocess_main",
    "tpformer-convert": "tpformer.cli.convert:main",
}
MODEL_SIZES = [
    "model.num_layers=2",
    "model.hidden_size=32",
    "model.num_heads=2",
    "model.intermediate_size=64",
    "model.vocab_size=200",
]
SIZES = [  # what every case shrinks that its command leaves to the defaults
    *MODEL_SIZES,
    "data.seq_length=32",
    "trainer.micro_batch_size=4",
    "trainer.max_steps=2",
    "trainer.eval_every=0",
    "trainer.save_every=0",
    "trainer.progress=false",
    "data.cache_dir=cache",
    *QUIET,
]


@dataclass(frozen=True)
class Case:
    """A documented command (the start of its text), what the test changes of it, what it adds
    (beyond SIZES), and what must be true after it ran (besides exit code 0)."""

    start: str
    check: Callable[[Path, str], object]
    replace: dict[str, str] = field(default_factory=dict)
    extra: tuple[str, ...] = ()
    sizes: tuple[str, ...] = tuple(SIZES)

    def runnable(self, cwd: Path, number: int) -> list:
        """[script, argv, cwd, env] for the runner; a run directory of its own (outputs/N)
        where the command names none."""
        env, argv = arguments(documented(self.start), self.replace)
        script = SCRIPTS[documented(self.start).split()[len(env)]]
        sizes = [*self.sizes, f"hydra.run.dir=outputs/{number}"] if self.sizes else []
        return [script, with_sizes([*argv, *self.extra], sizes), str(cwd), env]


def _trained(steps: int) -> Callable[[Path, str], None]:
    def check(cwd: Path, output: str) -> None:
        assert f"done: step {steps}" in output, output[-2000:]

    return check


def _has(*texts: str) -> Callable[[Path, str], None]:
    def check(cwd: Path, output: str) -> None:
        for text in texts:
            assert text in output, (text, output[-2000:])

    return check


def _exists(*patterns: str) -> Callable[[Path, str], None]:
    def check(cwd: Path, output: str) -> None:
        for pattern in patterns:
            assert list(cwd.glob(pattern)), (pattern, output[-2000:])

    return check


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


def _cases(vocab: dict[str, int]) -> list[Case]:
    one_epoch = ("trainer.epochs=1", "trainer.batch_size=8")
    return [
        # docs/configuration.md
        Case("tpformer-pretrain --cfg job", _has("hidden_size: 768", "num_layers: 12"), sizes=()),
        Case("tpformer-pretrain --config-dir my_conf", _has("zero_stage 1")),
        Case(
            "tpformer-preprocess data=text",
            _has("corpus cache/corpus-"),
            replace={"model.vocab_size=16000": "model.vocab_size=200", "workers=8": "workers=2"},
            sizes=tuple(SIZES[5:6] + ["data.cache_dir=cache"]),
        ),
        Case(
            "tpformer-pretrain data=text data.paths=[books.txt",
            _trained(2),
            replace={"model.vocab_size=16000": "model.vocab_size=200"},
        ),
        Case("tpformer-pretrain data=jsonl", _trained(2)),
        Case("tpformer-pretrain data=hf data.name=parquet data.paths=[shard0", _trained(2)),
        Case(
            "tpformer-pretrain data.tokenizer=hf/bert-base-uncased",
            _trained(2),
            replace={"model.vocab_size=30522": f"model.vocab_size={vocab['wordpiece']}"},
        ),
        Case("tpformer-pretrain data.num_workers=8", _trained(2), replace={"=8": "=2"}),
        Case("tpformer-pretrain data.num_workers=0", _trained(2)),
        # docs/data.md
        Case("tpformer-pretrain data=hf data.name=parquet 'data.paths=[shard-", _trained(2)),
        Case("tpformer-pretrain data=hf data.name=arrow", _trained(2)),
        # docs/parallel/offload.md
        Case("tpformer-pretrain model=bert_large parallel.zero_stage=2", _trained(2)),
        Case("tpformer-pretrain model=bert_large parallel.zero_stage=3", _trained(2)),
        Case("tpformer-pretrain model=bert_large parallel.recompute=full", _trained(2)),
        # docs/optimizers.md
        Case("tpformer-pretrain ... optim.name=lamb", _trained(2)),
        Case("tpformer-pretrain ... optim.name=lars", _trained(2)),
        Case("tpformer-pretrain ... optim.name=novograd", _trained(2)),
        # docs/logging.md: offline, nothing leaves the machine
        Case("WANDB_MODE=offline", _exists("outputs/*/wandb/offline-run-*/run-*.wandb")),
        # docs/checkpoints.md, then docs/hf.md on its checkpoint
        Case(
            "tpformer-pretrain trainer.save_every=100",
            _exists("runs/bert/checkpoints/step00000002"),
            replace={"save_every=100": "save_every=2"},
        ),
        Case(
            "tpformer-pretrain trainer.resume=auto hydra.run.dir=runs/bert",
            _has("done: step 4"),
            extra=("trainer.max_steps=4",),
        ),
        Case(
            "tpformer-pretrain trainer.exit_at_step=500",
            _exists("runs/stop/checkpoints/step00000001"),
            replace={"exit_at_step=500": "exit_at_step=1", "runs/bert": "runs/stop"},
        ),
        Case(
            "tpformer-convert to-hf runs/bert/checkpoints/step00000300",
            _exists("hf/bert/config.json", "hf/bert/model.safetensors"),
            replace={"step00000300": "step00000002"},
            sizes=(),
        ),
        Case("tpformer-convert from-hf hf/bert", _exists("runs/warm/checkpoints"), sizes=()),
        Case("tpformer-pretrain trainer.resume=runs/warm", _trained(2)),
        # README's dry runs and docs/finetuning.md's
        Case("tpformer-plan ... plan.dry_run=true", _has("dry run"), sizes=tuple(MODEL_SIZES)),
        Case(
            "tpformer-finetune ... dry_run.world=N",
            _has("rank 0"),
            replace={"dry_run.world=N": "dry_run.world=2"},
            extra=("task=sst2", "init=path/to/bert", "data.glue_dir=glue", *one_epoch),
            sizes=(),
        ),
        Case("tpformer-finetune task=sst2 init=path/to/bert data.glue_dir=glue parallel.tensor=8",
             _has("rank 0"), extra=one_epoch, sizes=()),  # fmt: skip
    ]


def test_the_documented_commands_run_at_tiny_sizes(tmp_path: Path) -> None:
    vocab = _write_inputs(tmp_path)
    cases = _cases(vocab)
    outcomes = run_cases([case.runnable(tmp_path, i) for i, case in enumerate(cases)], timeout=900)
    failed = []
    for case, (code, stdout, stderr, _) in zip(cases, outcomes, strict=True):
        try:
            assert code in (0, None), f"exit {code}: {(stdout + stderr)[-1500:]}"
            case.check(tmp_path, stdout + stderr)
        except AssertionError as err:
            failed.append(f"{case.start}: {err}")
    assert not failed, "\n\n".join(failed)
