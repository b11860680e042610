"""The documented layout commands and walkthroughs of docs/parallel/, docs/llama.md,
docs/modernbert.md, docs/logging.md, docs/optimizers.md, docs/generation.md, docs/hf.md and
docs/finetuning.md that no other test runs, as tests/docs/runs.py runs them: read from the
page, shrunk by stated sizes, in a working directory holding the files they name (a tiny Llama
with its byte-level BPE in path/to/llama, a tiny ModernBERT in path/to/modernbert, a tiny GPT-2
in hf/gpt2, a tiny BERT cached under the hub id docs/hf.md names, GLUE files in glue/). One
process runs the table; most of these launch 2-4 ranks, so the table is in the full suite only."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.data.common import write_corpus
from tests.data.test_glue import write_glue_file
from tests.data.test_hf_tokenizer_json import write_byte_level_bpe, write_tiny_llama
from tests.docs.commands import arguments, documented
from tests.docs.runs import FINETUNE_SIZES, SIZES, DocumentedRun, exists, run_table
from tests.inference.tiny_gpt2 import save_tiny_gpt2
from tests.interop.test_hub_ids import lay_out_hub_cache
from tests.models.test_modernbert import _hf_modernbert_with_vocab
from tests.train.test_finetune import sentiment_rows, write_hf_bert, write_sst2
from tests.train.test_trainer import REPO

pytestmark = pytest.mark.slow  # rank launches

NOT_THE_MODEL = tuple(s for s in SIZES if not s.startswith("model."))  # it is the checkpoint's
FOUR_LAYERS = tuple(s if s != "model.num_layers=2" else "model.num_layers=4" for s in SIZES)


def _write_inputs(cwd: Path) -> None:
    corpus = write_corpus(cwd / "books.txt", documents=12)
    tokenizer = write_byte_level_bpe(cwd / "bpe", corpus)
    write_tiny_llama(cwd / "path" / "to" / "llama", tokenizer)
    _hf_modernbert_with_vocab(cwd / "path" / "to" / "modernbert")
    save_tiny_gpt2(cwd / "hf" / "gpt2")
    (cwd / "prompts.txt").write_text("ROMEO:\nJULIET:\n")
    bert = write_hf_bert(cwd / "path" / "to" / "bert")
    lay_out_hub_cache(cwd / "hub", "google-bert/bert-base-uncased", "main", bert)
    write_sst2(cwd / "glue", train=32, dev=16)
    rows = [(a, a, ["entailment", "neutral", "contradiction"][int(label)])
            for a, _, label in sentiment_rows(24, 1)]  # fmt: skip
    write_glue_file(cwd / "glue", "MNLI", "train", rows)
    write_glue_file(cwd / "glue", "MNLI", "dev_matched", rows[:8])
    write_glue_file(cwd / "glue", "MNLI", "dev_mismatched", rows[8:16])


def _runs(cwd: Path) -> list[DocumentedRun]:
    one_epoch = ("trainer.epochs=1", "trainer.batch_size=8")
    return [
        # docs/llama.md: pretrain a preset; convert a Llama, continue it, export it
        DocumentedRun(
            "tpformer-convert from-hf path/to/llama runs/llama",
            exists("runs/llama/checkpoints/step00000000/meta.json"),
            sizes=(),
            hydra=False,
        ),
        DocumentedRun(
            "tpformer-pretrain model=llama_tiny",
            exists("{run}/metrics.jsonl"),
            replace={"model.vocab_size=4000": "model.vocab_size=200", "length=64": "length=32"},
        ),
        DocumentedRun(
            "tpformer-pretrain trainer.resume=runs/llama",
            exists("runs/llama/checkpoints/step00000002/meta.json"),
            extra=("trainer.save_every=2", "hydra.run.dir=runs/llama"),
            sizes=NOT_THE_MODEL,
        ),
        DocumentedRun(
            "tpformer-convert to-hf runs/llama",
            exists("hf/llama/config.json"),
            replace={"step00000600": "step00000002"},
            sizes=(),
            hydra=False,
        ),
        # docs/modernbert.md
        DocumentedRun(
            "tpformer-convert from-hf path/to/modernbert",
            exists("runs/modernbert/checkpoints/step00000000/meta.json"),
            sizes=(),
            hydra=False,
        ),
        # docs/logging.md: a trace of every rank
        DocumentedRun(
            "tpformer-pretrain parallel.tensor=2 launcher.nproc_per_node=2 trainer.max_steps=20",
            exists("{run}/profile/rank0.pt.trace.json", "{run}/profile/rank1.pt.trace.json"),
            replace={
                "max_steps=20": "max_steps=3",
                "profile.start=10": "profile.start=2",
                "profile.steps=3": "profile.steps=1",
            },
        ),
        # docs/optimizers.md
        DocumentedRun("tpformer-pretrain ... parallel.tensor=1", exists("{run}/metrics.jsonl")),
        # docs/parallel/context.md and pipeline.md
        DocumentedRun(
            "tpformer-pretrain model=gpt2_small data.seq_length=8192 parallel.context=4",
            exists("{run}/metrics.jsonl"),
            replace={"seq_length=8192": "seq_length=64"},
        ),
        DocumentedRun(
            "tpformer-pretrain model=bert_mini parallel.pipeline=4",
            exists("{run}/metrics.jsonl"),
            sizes=FOUR_LAYERS,
        ),
        DocumentedRun(
            "tpformer-pretrain model=bert_mini parallel.pipeline=2 parallel.pipeline_schedule="
            "pipedream parallel.pipedream_vertical_sync",
            exists("{run}/metrics.jsonl"),
        ),
        DocumentedRun(
            "tpformer-pretrain model=bert_mini parallel.pipeline=2 parallel.pipeline_schedule="
            "pipedream parallel.pipeline_replicas",
            exists("{run}/metrics.jsonl"),
            sizes=FOUR_LAYERS,
        ),
        # docs/generation.md: a Hugging Face GPT-2 sampled at TP=2
        DocumentedRun(
            "tpformer-generate init=hf/gpt2", exists("{run}/completions.jsonl"), sizes=()
        ),
        # docs/hf.md: a hub id, from the cache (offline)
        DocumentedRun(
            "tpformer-finetune task=sst2 init=google-bert/bert-base-uncased",
            exists("{run}/best/step*/meta.json"),
            extra=one_epoch,
            sizes=FINETUNE_SIZES,
        ),
        # docs/finetuning.md: MNLI at TP=2 x DP=2 with ZeRO-2
        DocumentedRun(
            "tpformer-finetune task=mnli",
            exists("{run}/results.json"),
            extra=one_epoch,
            sizes=FINETUNE_SIZES,
        ),
    ]


def test_the_documented_layouts_and_walkthroughs_run_at_tiny_sizes(tmp_path: Path) -> None:
    _write_inputs(tmp_path)
    hub = {"HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(tmp_path / "hub")}  # docs/hf.md's id
    run_table(tmp_path, _runs(tmp_path), hub)


def test_the_documented_single_case_runs_alone(tmp_path: Path) -> None:
    _, argv = arguments(documented("python -m pytest -n 0"))
    done = subprocess.run(
        [sys.executable, *argv, "-p", "no:cacheprovider", f"--basetemp={tmp_path / 'base'}"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout[-3000:]
    assert "1 passed" in done.stdout, done.stdout[-2000:]
