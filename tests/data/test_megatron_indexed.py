"""Megatron-LM indexed datasets, written by megatron-core's own IndexedDatasetBuilder, read in
place for BERT (a sequence per sentence) and GPT (a sequence per document, EOD appended); files
that do not match are refused, naming what was expected."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.data.common import corpus_tokenizer, write_corpus
from tpformer.data.causal_lm import CausalLMDataset
from tpformer.data.corpus import read_text, split_sentences
from tpformer.data.megatron_indexed import MegatronCorpus
from tpformer.data.pretraining import BertPretrainingDataset
from tpformer.data.tokenizer import Tokenizer

megatron = pytest.importorskip("megatron.core.datasets.indexed_dataset")


def write_megatron(prefix: Path, documents: list[list[list[int]]], dtype: type = np.uint16) -> Path:
    """documents -> <prefix>.bin/.idx with megatron-core's builder: one item per sequence,
    end_document() after each document (tools/preprocess_data.py's calls)."""
    builder = megatron.IndexedDatasetBuilder(f"{prefix}.bin", dtype=dtype)
    for document in documents:
        for sequence in document:
            builder.add_item(torch.tensor(sequence))
        builder.end_document()
    builder.finalize(f"{prefix}.idx")
    return prefix


@pytest.fixture(scope="module")
def sentences_and_tokenizer(tmp_path_factory: pytest.TempPathFactory) -> tuple:
    root = tmp_path_factory.mktemp("megatron")
    corpus = write_corpus(root / "c.txt", documents=12)
    tok = corpus_tokenizer(corpus, root / "tok")
    documents = [tok.encode(split_sentences(d)) for d in read_text((str(corpus),))]
    return root, documents, tok


def test_bert_reads_sentences_and_documents_as_megatron_wrote_them(
    sentences_and_tokenizer: tuple,
) -> None:
    root, documents, tok = sentences_and_tokenizer
    prefix = write_megatron(root / "bert_sentences", documents)
    corpus = MegatronCorpus(prefix)
    reference = megatron.IndexedDataset(str(prefix))
    assert corpus.num_documents == len(documents) and corpus.tokens.dtype == np.uint16
    assert np.array_equal(corpus.doc_offsets, reference.document_indices)
    for d, document in enumerate(documents):
        assert [s.tolist() for s in corpus.document(d)] == document
    flat = [s for d in documents for s in d]
    for i in (0, 5, len(flat) - 1):
        assert corpus.sentence(i).tolist() == reference[i].tolist() == flat[i]
    data = BertPretrainingDataset(
        corpus,
        tok,
        seq_length=48,
        mask_prob=0.15,
        whole_word=False,
        sentence_pairs="nsp",
        seed=3,
        eval_fraction=0.1,
    )
    batch = data.batch(range(8))
    assert batch["input_ids"].shape == (8, 48) and set(batch["nsp_labels"].tolist()) <= {0, 1}
    assert (batch["input_ids"][:, 0] == tok.cls_id).all()


def test_gpt_windows_are_the_megatron_token_stream_without_added_separators(
    sentences_and_tokenizer: tuple, tmp_path: Path
) -> None:
    """GPT preprocessing: one sequence per document with the EOD token appended; a causal LM
    reads the stream as written (no BOS/EOS of its own) at any dtype megatron-core chose."""
    _, documents, _ = sentences_and_tokenizer
    eod = 2
    docs = [[[t for s in d for t in s] + [eod]] for d in documents]
    stream = np.asarray([t for d in docs for t in d[0]])
    for dtype in (np.uint16, np.int32):
        corpus = MegatronCorpus(write_megatron(tmp_path / f"gpt_{dtype.__name__}", docs, dtype))
        assert not corpus.adds_document_tokens
        data = CausalLMDataset(corpus, seq_length=16, seed=0, eval_fraction=0.0)
        assert data.train.window(0, len(data.train)).tolist() == stream.tolist()


def test_files_that_are_not_a_megatron_dataset_are_refused(
    sentences_and_tokenizer: tuple, tmp_path: Path
) -> None:
    _, documents, _ = sentences_and_tokenizer
    good = write_megatron(tmp_path / "good", documents[:3])
    with pytest.raises(
        FileNotFoundError, match=r"missing\.idx is missing.*<prefix>\.bin and <prefix>\.idx"
    ):
        MegatronCorpus(tmp_path / "missing")

    def damaged(name: str, idx: bytes, bin_bytes: bytes | None = None) -> Path:
        Path(f"{tmp_path / name}.idx").write_bytes(idx)
        Path(f"{tmp_path / name}.bin").write_bytes(
            Path(f"{good}.bin").read_bytes() if bin_bytes is None else bin_bytes
        )
        return tmp_path / name

    idx = Path(f"{good}.idx").read_bytes()
    with pytest.raises(ValueError, match=r"not a Megatron-LM index.*expected b'MMIDIDX"):
        MegatronCorpus(damaged("header", b"NOTANIDX" + idx[8:]))
    with pytest.raises(ValueError, match="version 2; only version 1"):
        MegatronCorpus(damaged("version", idx[:9] + struct.pack("<Q", 2) + idx[17:]))
    with pytest.raises(ValueError, match="dtype code 6; token ids need an integer dtype"):
        MegatronCorpus(damaged("float", idx[:17] + bytes([6]) + idx[18:]))
    with pytest.raises(ValueError, match="the index is truncated"):
        MegatronCorpus(damaged("short_idx", idx[:-5]))
    with pytest.raises(ValueError, match=r"does not belong to this \.idx or is truncated"):
        MegatronCorpus(damaged("short_bin", idx, Path(f"{good}.bin").read_bytes()[:-2]))


def test_megatron_ids_outside_the_vocabulary_name_the_dataset(
    sentences_and_tokenizer: tuple, tmp_path: Path
) -> None:
    _, _, tok = sentences_and_tokenizer
    corpus = MegatronCorpus(write_megatron(tmp_path / "wide", [[[5, 6, 900]]]))
    with pytest.raises(ValueError, match=r"token id 900 at position 2.*written with another"):
        corpus.check_token_ids(Tokenizer(tok.path).vocab_size)
