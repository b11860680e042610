"""docs/data.md's Megatron-LM commands through the console script, as written there, with only
the sizes and the names rewritten (the overrides below): BERT on a sentence-split dataset, GPT on
a document dataset with EOD appended (both written by megatron-core's own builder), and the
documented blend of a text corpus with a Megatron dataset. Each trains two steps and exits 0,
naming the corpus it read (issue 68's seam: the documented prefix once failed the input check).
One process runs the three commands (tests/cli/bad_input_cases.py's runner)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.cli.bad_input_cases import run_cases
from tests.data.common import corpus_tokenizer, write_corpus
from tests.docs.commands import arguments, documented
from tests.train.test_trainer import QUIET
from tpformer.data.corpus import read_text, split_sentences

PRETRAIN = "tpformer.cli.pretrain:main"
SIZES = [  # the documented presets shrunk: what the test changes besides the names
    "model.num_layers=1",
    "model.hidden_size=32",
    "model.num_heads=2",
    "model.intermediate_size=64",
    "model.vocab_size=160",
    "data.seq_length=32",
    "trainer.micro_batch_size=4",
    "trainer.max_steps=2",
    "trainer.eval_every=0",
    "trainer.save_every=0",
    "trainer.progress=false",
    *QUIET,
]
DOCUMENTED = {  # docs/data.md's commands, read from the page (tests/docs/commands.py)
    "bert": documented("tpformer-pretrain model=bert_base data.source=megatron"),
    "gpt": documented("tpformer-pretrain model=gpt2_small data.source=megatron"),
    "blend": documented(
        "tpformer-pretrain model=bert_base data.tokenizer=bert-base-uncased/ 'data.blend"
    ),
}


def _write_megatron(prefix: Path, documents: list[list[list[int]]]) -> None:
    from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder

    builder = IndexedDatasetBuilder(f"{prefix}.bin", dtype=np.uint16)
    for document in documents:
        for sequence in document:
            builder.add_item(torch.tensor(sequence))
        builder.end_document()
    builder.finalize(f"{prefix}.idx")


@pytest.mark.slow  # three pretraining runs in one process
def test_the_documented_megatron_commands_train(tmp_path: Path) -> None:
    corpus = write_corpus(tmp_path / "wiki.txt", documents=16)
    tok = corpus_tokenizer(corpus, tmp_path / "tok")
    documents = [tok.encode(split_sentences(d)) for d in read_text((str(corpus),))]
    _write_megatron(tmp_path / "bert_text_sentence", documents)
    eod = 2  # Megatron's GPT preprocessing appends its EOD id to each document
    gpt_documents = [[[t for s in d for t in s] + [eod]] for d in documents]
    _write_megatron(tmp_path / "gpt_text_document", gpt_documents)
    names = {
        "my-bert_text_sentence": str(tmp_path / "bert_text_sentence"),
        "books_text_sentence": str(tmp_path / "bert_text_sentence"),
        "my-gpt2_text_document": str(tmp_path / "gpt_text_document"),
        "bert-base-uncased/": str(tok.path),
        "gpt2/": str(tok.path),
        "wiki.txt": str(corpus),
    }
    cases = []
    for name, command in DOCUMENTED.items():
        argv = [
            *arguments(command, {k: v for k, v in names.items() if k in command})[1],
            *SIZES,
            f"hydra.run.dir={tmp_path / name}",
        ]
        cases.append((PRETRAIN, argv, str(tmp_path)))
    outcomes = run_cases(cases)
    for (name, _), (code, _, stderr, _) in zip(DOCUMENTED.items(), outcomes, strict=True):
        assert code in (0, None), (name, stderr[-3000:])
        assert "done: step 2" in stderr, (name, stderr[-3000:])
        metrics = (tmp_path / name / "metrics.jsonl").read_text().splitlines()
        assert [json.loads(line)["step"] for line in metrics][-1] == 2, name
