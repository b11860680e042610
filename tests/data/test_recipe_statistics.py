"""BERT's pretraining recipe against its references, on the same Shakespeare text and the same
WordPiece vocabulary: the masked share and the 80/10/10 replacement against transformers'
DataCollatorForLanguageModeling, whole-word masking against its whole_word_mask mode, and the
sentence-pair rules of Google's create_pretraining_data.py (random next from another document,
short_seq_prob, targets filled from the document, truncation from either end), each within
three binomial standard deviations."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
import transformers

from tpformer.data.corpus import CorpusSpec, read_shakespeare, split_sentences
from tpformer.data.indexed import IndexedCorpus
from tpformer.data.masking import IGNORE
from tpformer.data.preprocess import preprocess
from tpformer.data.pretraining import BertPretrainingDataset, fill_chunks
from tpformer.data.tokenizer import SPECIAL_TOKENS, Tokenizer
from tpformer.interop.hf_tokenizer import export_tokenizer

SEQ, SAMPLES, SEED = 128, 400, 5
PLAYS = list(read_shakespeare())[:6]


def _close(p: float, q: float, n: int, m: int) -> bool:
    """Two observed rates agree within three standard deviations of their difference."""
    pooled = (p * n + q * m) / (n + m)
    return abs(p - q) <= 3 * np.sqrt(pooled * (1 - pooled) * (1 / n + 1 / m)) + 1e-12


@pytest.fixture(scope="module")
def wordpiece(tmp_path_factory: pytest.TempPathFactory) -> tuple[Tokenizer, object, IndexedCorpus]:
    """A WordPiece vocabulary trained on the plays (ours and transformers' tokenizers of it) and
    the plays preprocessed with it (a document per play: data.documents=file)."""
    from tokenizers import Tokenizer as Backend
    from tokenizers import models, normalizers, pre_tokenizers, trainers

    root = tmp_path_factory.mktemp("wordpiece")
    sentences = [s for play in PLAYS for s in split_sentences(play)]
    backend = Backend(models.WordPiece(unk_token="[UNK]"))
    backend.normalizer = normalizers.BertNormalizer(lowercase=True)
    backend.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    backend.train_from_iterator(
        sentences, trainers.WordPieceTrainer(vocab_size=800, special_tokens=list(SPECIAL_TOKENS))
    )
    (root / "wp").mkdir()
    vocab = sorted(backend.get_vocab().items(), key=lambda item: item[1])
    (root / "wp" / "vocab.txt").write_text("".join(f"{token}\n" for token, _ in vocab))
    ours = Tokenizer(root / "wp")
    export_tokenizer(root / "wp", root / "hf", "bert")
    hf = transformers.AutoTokenizer.from_pretrained(str(root / "hf"))
    files = [root / f"play{i}.txt" for i in range(len(PLAYS))]
    for file, play in zip(files, PLAYS):
        file.write_text(play)
    spec = CorpusSpec(source="text", paths=tuple(map(str, files)), documents="file")
    return ours, hf, preprocess(spec, ours, cache=root, workers=1, progress=False)


def _ours(wordpiece: tuple, **options) -> dict[str, torch.Tensor]:
    tok, _, corpus = wordpiece
    settings = {"mask_prob": 0.15, "whole_word": False, "sentence_pairs": "nsp"} | options
    data = BertPretrainingDataset(
        corpus, tok, seq_length=SEQ, seed=11, eval_fraction=0.0, **settings
    )
    return data.batch(range(SAMPLES))


def _theirs(wordpiece: tuple, *, whole_word: bool) -> tuple[dict, torch.Tensor]:
    """transformers' collator on sentence pairs of the same plays, SEQ tokens each."""
    _, hf, _ = wordpiece
    sentences = [s for play in PLAYS for s in split_sentences(play)]
    pairs = [(" ".join(sentences[i : i + 6]), " ".join(sentences[i + 6 : i + 12]))
             for i in range(0, 12 * SAMPLES, 12)]  # fmt: skip
    encoded = hf(
        [a for a, _ in pairs],
        [b for _, b in pairs],
        truncation=True,
        max_length=SEQ,
        padding="max_length",
        return_offsets_mapping=True,
        return_special_tokens_mask=True,
    )
    examples = [{k: encoded[k][i] for k in encoded} for i in range(len(pairs))]
    original = torch.tensor(encoded["input_ids"])
    collator = transformers.DataCollatorForLanguageModeling(
        hf, mlm_probability=0.15, whole_word_mask=whole_word, seed=SEED
    )
    return collator(examples), original


def _replacement_shares(inputs: torch.Tensor, labels: torch.Tensor, mask_id: int) -> list:
    chosen = labels != IGNORE
    picked, original = inputs[chosen], labels[chosen]
    n = int(chosen.sum())
    as_mask = float((picked == mask_id).float().mean())
    kept = float((picked == original).float().mean())
    return [n, as_mask, kept, 1 - as_mask - kept]


def test_masked_share_and_80_10_10_match_the_transformers_collator(wordpiece: tuple) -> None:
    ours_batch = _ours(wordpiece)
    theirs, original = _theirs(wordpiece, whole_word=False)
    tok = wordpiece[0]
    maskable = (ours_batch["attention_mask"] == 1) & ~torch.isin(
        torch.where(ours_batch["mlm_labels"] != IGNORE, ours_batch["mlm_labels"],
                    ours_batch["input_ids"]), torch.tensor(tok.special_ids))  # fmt: skip
    their_maskable = ~torch.isin(original, torch.tensor(tok.special_ids))
    ours_n = int(maskable.sum())
    ours_rate = float((ours_batch["mlm_labels"] != IGNORE).sum()) / ours_n
    their_rate = float((theirs["labels"] != IGNORE).sum()) / int(their_maskable.sum())
    assert _close(ours_rate, their_rate, ours_n, int(their_maskable.sum())), (
        ours_rate,
        their_rate,
    )
    mine = _replacement_shares(ours_batch["input_ids"], ours_batch["mlm_labels"], tok.mask_id)
    other = _replacement_shares(theirs["input_ids"], theirs["labels"], tok.mask_id)
    print(
        f"masked {ours_rate:.4f} vs {their_rate:.4f}; [MASK]/kept/random {mine[1:]} vs {other[1:]}"
    )
    for ours_share, their_share in zip(mine[1:], other[1:]):
        assert _close(ours_share, their_share, mine[0], other[0]), (mine, other)


@pytest.mark.slow  # over 5 s (the quick tier leaves single cases that long to the full run)
def test_whole_word_masking_chooses_words_as_the_transformers_collator(wordpiece: tuple) -> None:
    """Each side with its own word boundaries: a chosen word is masked whole; the share of
    tokens masked and of multi-piece words chosen agree. One-piece words differ, by Google's
    rule: the budget is 15% of the tokens and a word that would overflow it is skipped, so the
    last picks favour one-piece words (measured 0.158 against the collator's 0.145, which draws
    each word with probability 0.15 and has no budget). The collator writes [MASK] for every
    chosen token (it refuses random replacement with whole words); ours keeps 80/10/10."""
    tok, _, _ = wordpiece
    ours = _ours(wordpiece, whole_word=True)
    theirs, original = _theirs(wordpiece, whole_word=True)

    def word_rates(ids: torch.Tensor, chosen: torch.Tensor, starts: torch.Tensor) -> list:
        rates = []
        for multi in (False, True):
            hits = total = 0
            for row in range(ids.shape[0]):
                begin = [*starts[row].nonzero().flatten().tolist(), ids.shape[1]]
                for s, e in itertools.pairwise(begin):
                    pieces = chosen[row, s:e]
                    span = int((ids[row, s:e] != tok.pad_id).sum())
                    if span == 0 or (span > 1) != multi:
                        continue
                    assert pieces[:span].all() or not pieces[:span].any(), "word partly masked"
                    total, hits = total + 1, hits + int(pieces[0])
            rates.append((hits / total, total))
        return rates

    ours_ids = torch.where(ours["mlm_labels"] != IGNORE, ours["mlm_labels"], ours["input_ids"])
    special = torch.isin(ours_ids, torch.tensor(tok.special_ids))
    ours_starts = ~special & (tok.word_start[ours_ids] | torch.roll(special, 1, 1))
    theirs_special = torch.isin(original, torch.tensor(tok.special_ids))
    offsets = torch.tensor(_theirs_offsets(wordpiece))
    gap = offsets[:, :, 0] != torch.roll(offsets[:, :, 1], 1, 1)
    their_starts = ~theirs_special & (gap | torch.roll(theirs_special, 1, 1))
    mine = word_rates(ours_ids.masked_fill(special, tok.pad_id), ours["mlm_labels"] != IGNORE,
                      ours_starts)  # fmt: skip
    other = word_rates(original.masked_fill(theirs_special, tok.pad_id),
                       theirs["labels"] != IGNORE, their_starts)  # fmt: skip
    print(f"word shares (one piece, several): ours {mine}, transformers {other}")
    (one, _), (multi, n_multi) = mine
    assert _close(multi, other[1][0], n_multi, other[1][1]), (mine, other)
    assert one > other[0][0], (mine, other)  # Google's overflow skip, the one difference
    tokens = [int((~s & (ids != tok.pad_id)).sum()) for ids, s in
              [(ours_ids, special), (original, theirs_special)]]  # fmt: skip
    masked = [float((ours["mlm_labels"] != IGNORE).sum()) / tokens[0],
              float((theirs["labels"] != IGNORE).sum()) / tokens[1]]  # fmt: skip
    # the collator draws words, not tokens: its share's variance is p(1-p) sum(k^2) / n^2
    word = torch.cumsum(their_starts.flatten().long(), 0)
    sizes = torch.bincount(word[~theirs_special.flatten() & (original.flatten() != tok.pad_id)])
    sigma = np.sqrt(0.15 * 0.85 * float((sizes.float() ** 2).sum())) / tokens[1]
    assert abs(masked[0] - masked[1]) <= 3 * np.hypot(sigma, np.sqrt(0.15 * 0.85 / tokens[0])), (
        masked,
        sigma,
    )
    shares = _replacement_shares(ours["input_ids"], ours["mlm_labels"], tok.mask_id)
    assert abs(shares[1] - 0.8) <= 3 * np.sqrt(0.16 / shares[0]), shares
    assert _replacement_shares(theirs["input_ids"], theirs["labels"], tok.mask_id)[1] == 1.0


def _theirs_offsets(wordpiece: tuple) -> list:
    _, hf, _ = wordpiece
    sentences = [s for play in PLAYS for s in split_sentences(play)]
    return hf(
        [" ".join(sentences[i : i + 6]) for i in range(0, 12 * SAMPLES, 12)],
        [" ".join(sentences[i + 6 : i + 12]) for i in range(0, 12 * SAMPLES, 12)],
        truncation=True,
        max_length=SEQ,
        padding="max_length",
        return_offsets_mapping=True,
    )["offset_mapping"]


def _document_of(corpus: IndexedCorpus, segment: np.ndarray) -> int:
    """The document a segment (a view of the token file) was cut from."""
    start = (segment.ctypes.data - corpus.tokens.ctypes.data) // corpus.tokens.itemsize
    sentence = int(np.searchsorted(corpus.sentence_offsets, start, side="right")) - 1
    return int(np.searchsorted(corpus.doc_offsets, sentence, side="right")) - 1


@pytest.mark.parametrize("pairs", ["nsp", "sop"])
def test_sentence_pairs_follow_googles_rules(wordpiece: tuple, pairs: str) -> None:
    """NSP: half the pairs (within binomial error) have a second segment from another document,
    the others the true continuation; SOP: half swapped, both segments always of one document.
    No pair exceeds the sample, and the first segment is never empty."""
    tok, _, corpus = wordpiece
    data = BertPretrainingDataset(
        corpus, tok, seq_length=SEQ, mask_prob=0.15, whole_word=False, sentence_pairs=pairs,
        seed=3, eval_fraction=0.0, short_seq_prob=0.1,
    )  # fmt: skip
    labels, n = [], 1000
    for i in range(n):
        g = torch.Generator().manual_seed(i)
        a, b, label = data._segments(data.train_chunks, data.train_docs, i % len(data), g)
        assert len(a) and len(b) and len(a) + len(b) <= SEQ - 3
        same = _document_of(corpus, a) == _document_of(corpus, b)
        assert same != (pairs == "nsp" and label == 1), (i, label)
        if same:  # in order, or swapped for SOP's label 1
            first, second = (b, a) if label else (a, b)
            assert first.ctypes.data < second.ctypes.data
        labels.append(label)
    rate = float(np.mean(labels))
    assert abs(rate - 0.5) <= 3 * np.sqrt(0.25 / n), rate


def test_targets_fill_the_sample_with_short_seq_prob_shorter(wordpiece: tuple) -> None:
    """fill_chunks: a chunk's target is the full room, or with probability short_seq_prob
    uniform in [2, room]; a chunk takes whole sentences until it holds its target, or its
    document ends."""
    _, _, corpus = wordpiece
    room = SEQ - 3
    rows = fill_chunks(corpus, range(corpus.num_documents), room, 0.1, seed=0)
    targets = rows[:, 3]
    short = targets < room
    n = len(rows)
    assert abs(short.mean() - 0.1) <= 3 * np.sqrt(0.09 / n) + 1 / room, (short.mean(), n)
    mean, spread = (2 + room) / 2, (room - 2) / np.sqrt(12)
    assert abs(targets[short].mean() - mean) <= 3 * spread / np.sqrt(short.sum())
    sizes = corpus.sentence_offsets[rows[:, 2]] - corpus.sentence_offsets[rows[:, 1]]
    last = corpus.doc_offsets[rows[:, 0] + 1] == rows[:, 2]
    assert np.all((sizes >= targets) | last)
    before = corpus.sentence_offsets[rows[:, 2] - 1] - corpus.sentence_offsets[rows[:, 1]]
    assert np.all(before < targets), "a chunk took a sentence after reaching its target"
    print(f"{n} chunks, {short.mean():.3f} short, full chunks end at doc end: {last.mean():.3f}")


def test_max_predictions_per_seq_caps_the_masked_positions(wordpiece: tuple) -> None:
    capped = _ours(wordpiece, max_predictions=6)
    counts = (capped["mlm_labels"] != IGNORE).sum(1)
    full = (_ours(wordpiece)["mlm_labels"] != IGNORE).sum(1)
    assert int(counts.max()) == 6 and torch.equal(counts, full.clamp(max=6))
