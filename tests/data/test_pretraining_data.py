"""BERT pretraining samples: masking statistics, NSP/SOP labels, whole words, the order."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.data.common import corpus_tokenizer, text_spec, write_corpus
from tpformer.data.causal_lm import CausalLMDataset
from tpformer.data.indexed import IndexedCorpus
from tpformer.data.loader import micro_batch_ranges
from tpformer.data.masking import IGNORE
from tpformer.data.preprocess import preprocess
from tpformer.data.pretraining import BertPretrainingDataset
from tpformer.data.tokenizer import Tokenizer


@pytest.fixture(scope="module")
def prepared(tmp_path_factory: pytest.TempPathFactory) -> tuple[IndexedCorpus, Tokenizer]:
    root = tmp_path_factory.mktemp("corpus")
    corpus = write_corpus(root / "c.txt", documents=40)
    tok = corpus_tokenizer(corpus, root / "tok")
    return preprocess(text_spec(corpus), tok, cache=root, workers=1, progress=False), tok


def dataset(prepared, **overrides) -> BertPretrainingDataset:
    corpus, tok = prepared
    options = {
        "seq_length": 64,
        "mask_prob": 0.15,
        "whole_word": False,
        "sentence_pairs": "nsp",
        "seed": 7,
        "eval_fraction": 0.1,
        **overrides,
    }
    return BertPretrainingDataset(corpus, tok, **options)


def test_masking_statistics(prepared) -> None:
    data = dataset(prepared)
    tok = prepared[1]
    batch = data.batch(range(400))
    ids, labels, mask = batch["input_ids"], batch["mlm_labels"], batch["attention_mask"]
    chosen = labels != IGNORE
    special = torch.isin(torch.where(chosen, labels, ids), torch.tensor(tok.special_ids))
    assert not (chosen & special).any(), "a special token was chosen for prediction"
    maskable = mask.bool() & ~torch.isin(ids, torch.tensor([tok.cls_id, tok.sep_id, tok.pad_id]))
    rate = chosen.sum() / (maskable | chosen).sum()
    assert abs(rate - 0.15) < 0.01, rate
    replaced = ids[chosen]
    truth = labels[chosen]
    as_mask = (replaced == tok.mask_id).float().mean()
    kept = (replaced == truth).float().mean()
    random = 1 - as_mask - kept
    assert abs(as_mask - 0.8) < 0.03 and abs(kept - 0.1 - random * 0.01) < 0.03, (as_mask, kept)
    assert abs(random - 0.1) < 0.03, random
    structure = (ids == tok.cls_id).sum(1), (torch.where(chosen, labels, ids) == tok.sep_id).sum(1)
    assert (structure[0] == 1).all() and (structure[1] == 2).all()


def test_nsp_labels_are_balanced_and_segments_typed(prepared) -> None:
    batch = dataset(prepared).batch(range(600))
    rate = batch["nsp_labels"].float().mean()
    assert abs(rate - 0.5) < 0.05, rate
    types, mask = batch["token_type_ids"], batch["attention_mask"]
    assert (types[:, 0] == 0).all() and (types[mask == 0] == 0).all()
    assert (types.sum(1) > 0).all(), "every sample has a second segment"
    lengths, labels = mask.sum(1).float(), batch["nsp_labels"]
    ratio = lengths[labels == 1].mean() / lengths[labels == 0].mean()
    assert abs(ratio - 1) < 0.05, f"the sample length gives the NSP label away ({ratio:.3f})"


def test_sop_swaps_segments(prepared) -> None:
    data = dataset(prepared, sentence_pairs="sop", mask_prob=0.0001)
    untruncated = 0
    for i in range(50):
        sample = data.sample(i)
        ids = torch.where(sample["mlm_labels"] != IGNORE, sample["mlm_labels"], sample["input_ids"])
        sep = (ids == prepared[1].sep_id).nonzero().flatten().tolist()
        a, b = ids[1 : sep[0]].tolist(), ids[sep[0] + 1 : sep[1]].tolist()
        original = prepared[0].tokens.tolist()
        text = ",".join(map(str, original))
        order = (a, b) if sample["nsp_labels"] == 0 else (b, a)
        assert all(",".join(map(str, part)) in text for part in order)
        if len(a) + len(b) < data.room:  # not truncated: Google's trims either end at random
            untruncated += 1
            assert ",".join(map(str, order[0] + order[1])) in text, "segments not consecutive"
    assert untruncated >= 5, untruncated


def test_whole_word_masking_masks_every_piece_of_a_word(prepared) -> None:
    tok = prepared[1]
    batch = dataset(prepared, whole_word=True).batch(range(200))
    labels, ids = batch["mlm_labels"], batch["input_ids"]
    truth = torch.where(labels != IGNORE, labels, ids)
    chosen = labels != IGNORE
    continuation = ~tok.word_start[truth] & (batch["attention_mask"] == 1)
    continuation[:, 0] = False
    split_words = 0
    for row in range(truth.shape[0]):
        for pos in continuation[row].nonzero().flatten().tolist():
            if (
                int(truth[row, pos]) in tok.special_ids
                or int(truth[row, pos - 1]) in tok.special_ids
            ):
                continue
            split_words += 1
            assert chosen[row, pos] == chosen[row, pos - 1], "a word was partly masked"
    assert split_words > 100
    rate = chosen.sum() / ((batch["attention_mask"] == 1).sum() - 3 * truth.shape[0])
    assert abs(rate - 0.15) < 0.02, rate


def test_global_batch_of_a_step_does_not_depend_on_the_layout(prepared) -> None:
    data = dataset(prepared)

    def step_samples(step: int, micro: int, accum: int, dp: int) -> torch.Tensor:
        parts = [
            data.batch(r)["input_ids"]
            for rank in range(dp)
            for r in micro_batch_ranges(
                step, micro_batch_size=micro, grad_accum=accum, dp_size=dp, dp_rank=rank
            )
        ]
        return torch.cat(parts)

    for step in (0, 3, len(data) // 8 + 1):  # the last one is in the second epoch
        reference = step_samples(step, 8, 1, 1)
        for micro, accum, dp in [(4, 1, 2), (4, 2, 1), (2, 2, 2), (1, 2, 4)]:
            assert torch.equal(step_samples(step, micro, accum, dp), reference)
    epoch = [int(data.order(i)) for i in range(len(data))]
    assert sorted(epoch) == list(range(len(data))), "an epoch visits every chunk once"
    assert epoch != [int(data.order(len(data) + i)) for i in range(len(data))]


def test_eval_documents_are_held_out_and_short_corpora_fail(prepared, tmp_path: Path) -> None:
    data = dataset(prepared)
    assert set(data.eval_chunks[:, 0].tolist()) == {36, 37, 38, 39}
    assert not set(data.train_chunks[:, 0].tolist()) & {36, 37, 38, 39}
    corpus, tok = prepared
    tiny = tmp_path / "tiny.txt"
    tiny.write_text("The king loves the crown.\n")
    small = preprocess(text_spec(tiny), tok, cache=tmp_path, workers=1, progress=False)
    with pytest.raises(
        ValueError,
        match=r"has \d+ tokens, fewer than one sequence of "
        r"data.seq_length=64",
    ):
        BertPretrainingDataset(
            small,
            tok,
            seq_length=64,
            mask_prob=0.15,
            whole_word=False,
            sentence_pairs="nsp",
            seed=1,
            eval_fraction=0.0,
        )
    gpt = CausalLMDataset(corpus, seq_length=32, seed=1, eval_fraction=0.1)
    window = gpt.batch(range(3))["input_ids"]
    assert window.shape == (3, 32) and window.dtype == torch.long
