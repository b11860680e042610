"""data.pack: BERT samples filled with [CLS] piece [SEP] pieces of several documents (every
training token once per epoch, no padding but the last sequence's), GPT windows whose positions
restart at each document; the layout the model tests (tests/models/test_packing.py) run."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.data.common import corpus_tokenizer, text_spec, write_corpus
from tpformer.data.causal_lm import CausalLMDataset
from tpformer.data.indexed import IndexedCorpus
from tpformer.data.preprocess import preprocess
from tpformer.data.pretraining import BertPretrainingDataset, document_positions
from tpformer.data.tokenizer import Tokenizer

SEQ = 64


@pytest.fixture(scope="module")
def prepared(tmp_path_factory: pytest.TempPathFactory) -> tuple[IndexedCorpus, Tokenizer]:
    """Documents of 1 to 12 sentences: many shorter than a sequence (what packing is for)."""
    root = tmp_path_factory.mktemp("packing")
    path = write_corpus(root / "c.txt", documents=40, sentences=12)
    text = path.read_text().split("\n\n")
    short = ["\n".join(doc.splitlines()[: 1 + i % 4]) for i, doc in enumerate(text)]
    path.write_text("\n\n".join(short) + "\n")
    tok = corpus_tokenizer(path, root / "tok")
    return preprocess(text_spec(path), tok, cache=root, workers=1, progress=False), tok


def bert(prepared, pack: bool) -> BertPretrainingDataset:
    corpus, tok = prepared
    return BertPretrainingDataset(
        corpus,
        tok,
        seq_length=SEQ,
        mask_prob=0.15,
        whole_word=False,
        sentence_pairs="none",
        seed=3,
        eval_fraction=0.1,
        pack=pack,
    )


def pad_fraction(data: BertPretrainingDataset) -> float:
    batch = data.batch(range(len(data)))
    return 1 - float(batch["attention_mask"].float().mean())


def test_packed_bert_samples_fill_the_sequence_with_whole_pieces(prepared) -> None:
    _, tok = prepared
    data = bert(prepared, pack=True)
    alone = bert(prepared, pack=False)
    assert len(data) < len(alone)
    assert pad_fraction(data) < 0.01 < 0.2 < pad_fraction(alone)
    batch = data.batch(range(len(data)))
    ids, positions = batch["input_ids"], batch["position_ids"]
    labels, attention = batch["mlm_labels"], batch["attention_mask"].bool()
    starts = (positions == 0) & attention
    assert starts[:, 0].all() and int(starts.sum(1).max()) > 1  # several documents a sequence
    originals = torch.where(labels != -100, labels, ids)
    assert (originals[starts] == tok.cls_id).all()  # each piece opens with [CLS]
    ends = torch.zeros_like(starts)
    ends[:, :-1] = starts[:, 1:]
    ends |= attention & ~torch.roll(attention, -1, dims=1)  # the last token of the last piece
    ends[:, -1] |= attention[:, -1]
    assert (originals[ends] == tok.sep_id).all()  # ... and closes with [SEP]
    assert ((labels == -100) | ~(starts | ends)).all()  # no special token is a target
    assert (batch["token_type_ids"] == 0).all()


def test_packing_keeps_every_training_token_once_in_order(prepared) -> None:
    """The pieces of each chunk are its tokens, cut where a sequence ends and continued."""
    data = bert(prepared, pack=True)
    assert data.train_packs is not None
    pieces, offsets = data.train_packs
    assert offsets[0] == 0 and offsets[-1] == len(pieces) and (np.diff(offsets) > 0).all()
    for i in range(len(offsets) - 1):  # each sequence: pieces + [CLS]/[SEP] within SEQ
        assert (
            int(pieces[offsets[i] : offsets[i + 1], 2].sum()) + 2 * (offsets[i + 1] - offsets[i])
            <= SEQ
        )
    corpus = data.corpus
    for chunk, row in enumerate(data.train_chunks):
        mine = pieces[pieces[:, 0] == chunk]
        assert list(mine[:, 1]) == list(np.cumsum([0, *mine[:-1, 2]]))  # contiguous
        size = int(corpus.sentence_offsets[row[2]] - corpus.sentence_offsets[row[1]])
        assert int(mine[:, 2].sum()) == size


def test_packed_samples_are_a_function_of_seed_and_index(prepared) -> None:
    one, two = bert(prepared, pack=True), bert(prepared, pack=True)
    for index in (0, 5, len(one) + 2):  # the next epoch included
        a, b = one.sample(index), two.sample(index)
        assert all(torch.equal(a[k], b[k]) for k in a)
    assert "position_ids" not in bert(prepared, pack=False).sample(0)


def test_pair_samples_cannot_be_packed(prepared) -> None:
    corpus, tok = prepared
    with pytest.raises(ValueError, match=r"data\.sentence_pairs=nsp makes sentence pairs"):
        BertPretrainingDataset(
            corpus, tok, seq_length=SEQ, mask_prob=0.15, whole_word=False,
            sentence_pairs="nsp", seed=3, eval_fraction=0.1, pack=True,
        )  # fmt: skip


def test_gpt_windows_restart_positions_at_each_document(prepared) -> None:
    corpus, tok = prepared
    bos = tok.cls_id  # a marker no document holds (this tokenizer has no BOS of its own)
    options = {"seq_length": 32, "seed": 1, "eval_fraction": 0.1, "bos": bos, "eos": tok.sep_id}
    packed = CausalLMDataset(corpus, pack=True, **options)
    plain = CausalLMDataset(corpus, **options)
    indices = range(len(packed))
    batch, same = packed.batch(indices), plain.batch(indices)
    assert torch.equal(batch["input_ids"], same["input_ids"]) and "position_ids" not in same
    ids, positions = batch["input_ids"], batch["position_ids"]
    assert (positions[:, 0] == 0).all()
    assert torch.equal(positions[:, 1:] == 0, ids[:, 1:] == bos)  # restarts at BOS
    steps = positions[:, 1:] - positions[:, :-1]
    assert ((steps == 1) | (positions[:, 1:] == 0)).all()
    held = packed.batch(range(3), split="eval")["position_ids"]
    assert held.shape == (3, 32) and (held[:, 0] == 0).all()


def test_document_positions_continue_into_padding() -> None:
    assert document_positions([0, 3, 5], 8).tolist() == [0, 1, 2, 0, 1, 0, 1, 2]
