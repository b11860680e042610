"""Pretraining samples from a preprocessed corpus, each a pure function of (seed, global index).

Training sample g of the global order is chunk perm_e[g mod N] of epoch e = g // N, where perm_e
is a permutation seeded by (seed, e); its segment split, random next segment and masks come from
a generator seeded by (seed, g). Which samples a step trains on therefore depends only on (seed,
epoch, step) -- never on dp, micro-batch size or accumulation -- and resuming continues the order.
The last `eval_fraction` of the documents are held out for evaluation.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor

from tpformer.data.indexed import TokenCorpus
from tpformer.data.masking import IGNORE, mask_tokens
from tpformer.data.tokenizer import Tokenizer
from tpformer.parallel.random import derive_seed

_ORDER, _SAMPLE, _EVAL, _PACK, _PACKED = 0x0DE5, 0x5A3E, 0xE7A1, 0xFAC7, 0xD0C5


class EpochOrder:
    """Global sample index -> item index, reshuffled every epoch from (seed, epoch)."""

    def __init__(self, size: int, seed: int) -> None:
        self.size, self.seed = size, seed
        self._epoch, self._perm = -1, torch.empty(0, dtype=torch.long)

    def __call__(self, index: int) -> int:
        epoch = index // self.size
        if epoch != self._epoch:
            g = torch.Generator().manual_seed(derive_seed(self.seed, epoch, _ORDER))
            self._epoch, self._perm = epoch, torch.randperm(self.size, generator=g)
        return int(self._perm[index % self.size])


def split_documents(corpus: TokenCorpus, eval_fraction: float) -> tuple[range, range]:
    """(training documents, held-out documents); nothing is held out from a one-document corpus."""
    n = corpus.num_documents
    held = 0 if n < 2 or eval_fraction <= 0 else min(n - 1, max(1, round(eval_fraction * n)))
    return range(0, n - held), range(n - held, n)


def pack_chunks(corpus: TokenCorpus, documents: range, target: int) -> np.ndarray:
    """[n, 3] rows (document, first sentence, end sentence): whole sentences of one document
    packed greedily up to `target` tokens (a longer sentence is a chunk of its own)."""
    lengths = corpus.sentence_lengths()
    rows: list[tuple[int, int, int]] = []
    for d in documents:
        first, end = int(corpus.doc_offsets[d]), int(corpus.doc_offsets[d + 1])
        start, size = first, 0
        for i in range(first, end):
            if size and size + lengths[i] > target:
                rows.append((d, start, i))
                start, size = i, 0
            size += int(lengths[i])
        if size:
            rows.append((d, start, end))
    return np.asarray(rows, dtype=np.int64).reshape(-1, 3)


def pack_sequences(
    corpus: TokenCorpus, chunks: np.ndarray, seq_length: int, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """Several documents per sequence (data.pack): the chunks, in an order seeded once, laid
    end to end as [CLS] tokens [SEP] pieces and cut into sequences of `seq_length`, a chunk
    that does not fit continuing as the next sequence's first piece (so no sequence is padded
    but the last). -> (pieces [n, 3]: chunk, first token, token count; offsets [m + 1]: the
    pieces of sequence i are pieces[offsets[i]:offsets[i + 1]])."""
    rng = np.random.default_rng(derive_seed(seed, _PACKED))
    offsets = corpus.sentence_offsets
    sizes = offsets[chunks[:, 2]] - offsets[chunks[:, 1]]
    pieces: list[tuple[int, int, int]] = []
    starts, room = [0], seq_length
    for chunk in rng.permutation(len(chunks)):
        first, left = 0, int(sizes[chunk])
        while left:
            if room < 3:  # no room for [CLS], a token and [SEP]: the next sequence
                starts.append(len(pieces))
                room = seq_length
            take = min(left, room - 2)
            pieces.append((int(chunk), first, take))
            first, left, room = first + take, left - take, room - take - 2
    starts.append(len(pieces))
    return np.asarray(pieces, dtype=np.int64).reshape(-1, 3), np.asarray(starts, dtype=np.int64)


def document_positions(starts: Sequence[int], seq_length: int) -> Tensor:
    """[seq_length] positions restarting at 0 at each document start (`starts`, ascending,
    starts[0] == 0); the padding after the last document continues its positions."""
    index = torch.arange(seq_length)
    first = torch.tensor(starts, dtype=torch.long)
    return index - first[torch.searchsorted(first, index, right=True) - 1]


def fill_chunks(
    corpus: TokenCorpus, documents: range, target: int, short_prob: float, seed: int
) -> np.ndarray:
    """[n, 4] rows (document, first sentence, end sentence, target length): Google's
    create_instances_from_document. Each chunk takes whole sentences of one document until it
    holds its target length (the last sentence may overshoot; the sample truncates), the target
    being `target`, or with probability short_prob a random length in [2, target]."""
    lengths = corpus.sentence_lengths()
    rng = np.random.default_rng(derive_seed(seed, _PACK))
    rows: list[tuple[int, int, int, int]] = []

    def pick() -> int:
        return int(rng.integers(2, target + 1)) if rng.random() < short_prob else target

    for d in documents:
        first, end = int(corpus.doc_offsets[d]), int(corpus.doc_offsets[d + 1])
        start, size, goal = first, 0, pick()
        for i in range(first, end):
            size += int(lengths[i])
            if size >= goal or i == end - 1:
                rows.append((d, start, i + 1, goal))
                start, size, goal = i + 1, 0, pick()
    return np.asarray(rows, dtype=np.int64).reshape(-1, 4)


def truncate_pair(
    a: np.ndarray, b: np.ndarray, room: int, g: torch.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Google's truncate_seq_pair: a token off the longer segment until both fit `room`, from
    its front or its back at random (the counts drawn at once, the same distribution)."""
    la, lb = len(a), len(b)
    while la + lb > room:
        if la > lb:
            la -= 1
        else:
            lb -= 1

    def cut(x: np.ndarray, keep: int) -> np.ndarray:
        drop = len(x) - keep
        front = int((torch.rand(drop, generator=g) < 0.5).sum()) if drop else 0
        return x[front : front + keep]

    return cut(a, la), cut(b, lb)


def check_corpus_size(corpus: TokenCorpus, documents: range, seq_length: int) -> None:
    tokens = int(
        corpus.sentence_offsets[corpus.doc_offsets[documents.stop]]
        - corpus.sentence_offsets[corpus.doc_offsets[documents.start]]
    )
    if tokens < seq_length:
        raise ValueError(
            f"the training corpus {corpus.prefix} has {tokens} tokens, fewer than one "
            f"sequence of data.seq_length={seq_length}; use a larger corpus or a "
            f"shorter data.seq_length"
        )


class BertPretrainingDataset:
    """[CLS] A [SEP] B [SEP] samples with MLM labels and an NSP or SOP label; with
    sentence_pairs=none [CLS] sentences [SEP] (whole sentences of one document packed to the
    length) and MLM labels only (RoBERTa's and ModernBERT's recipe); with `pack` as well,
    several such pieces of different documents per sequence (pack_sequences), with
    `position_ids` restarting at each (the model attends within each piece)."""

    def __init__(
        self,
        corpus: TokenCorpus,
        tokenizer: Tokenizer,
        *,
        seq_length: int,
        mask_prob: float,
        whole_word: bool,
        sentence_pairs: str,
        seed: int,
        eval_fraction: float,
        short_seq_prob: float = 0.0,
        max_predictions: int = 0,
        pack: bool = False,
    ) -> None:
        tokenizer.check_bert_specials()
        if pack and sentence_pairs != "none":
            raise ValueError(
                f"data.pack=true packs MLM-only samples; data.sentence_pairs={sentence_pairs} "
                "makes sentence pairs: set data.sentence_pairs=none"
            )
        self.corpus, self.tok, self.seq, self.seed = corpus, tokenizer, seq_length, seed
        self.mask_prob, self.whole_word, self.pairs = mask_prob, whole_word, sentence_pairs
        self.max_predictions = max_predictions
        train_docs, eval_docs = split_documents(corpus, eval_fraction)
        check_corpus_size(corpus, train_docs, seq_length)
        self.room = seq_length - (2 if sentence_pairs == "none" else 3)

        def chunks(documents: range) -> np.ndarray:
            if sentence_pairs == "none":
                return pack_chunks(corpus, documents, self.room)
            return fill_chunks(corpus, documents, self.room, short_seq_prob, seed)

        self.train_docs = train_docs
        self.eval_docs = eval_docs if len(eval_docs) else train_docs
        self.train_chunks = chunks(train_docs)
        self.eval_chunks = chunks(eval_docs) if len(eval_docs) else self.train_chunks
        self.train_packs = self.eval_packs = None
        if pack:
            self.train_packs = pack_sequences(corpus, self.train_chunks, seq_length, seed)
            self.eval_packs = pack_sequences(corpus, self.eval_chunks, seq_length, seed)
        self.order = EpochOrder(len(self), seed)
        special = torch.zeros(tokenizer.vocab_size, dtype=torch.bool)
        special[tokenizer.special_ids] = True
        self.random_ids = (~special).nonzero().flatten()
        self.word_start = tokenizer.word_start

    def __len__(self) -> int:
        if self.train_packs is not None:
            return len(self.train_packs[1]) - 1
        return len(self.train_chunks)

    def _span(self, row: np.ndarray) -> np.ndarray:
        return self.corpus.span(int(row[1]), int(row[2]))

    def _random_segment(
        self, documents: range, avoid: int, length: int, g: torch.Generator
    ) -> np.ndarray:
        """Google's random next: whole sentences from a random sentence of a random other
        document (10 tries), until `length` tokens (the start chosen among those that leave
        that many before the document ends, so the length does not give the label away)."""
        for _ in range(10):
            d = documents.start + int(torch.randint(0, len(documents), (1,), generator=g))
            if d != avoid:
                break
        first, end = int(self.corpus.doc_offsets[d]), int(self.corpus.doc_offsets[d + 1])
        offsets = self.corpus.sentence_offsets  # starts that leave `length` tokens, if any
        last = int(np.searchsorted(offsets, offsets[end] - length, side="right")) - 1
        start = int(torch.randint(first, max(first, min(last, end - 1)) + 1, (1,), generator=g))
        stop = int(np.searchsorted(offsets, offsets[start] + length, side="left"))
        return self.corpus.span(start, min(max(stop, start + 1), end))

    def _segments(
        self, chunks: np.ndarray, documents: range, item: int, g: torch.Generator
    ) -> tuple[np.ndarray, np.ndarray, int]:
        d, first, end, _ = (int(x) for x in chunks[item])
        if end - first >= 2:
            cut = int(torch.randint(first + 1, end, (1,), generator=g))
            a, b = self.corpus.span(first, cut), self.corpus.span(cut, end)
        else:  # one sentence: its halves
            tokens = self.corpus.span(first, end)
            a, b = tokens[: len(tokens) // 2], tokens[len(tokens) // 2 :]
        flip = bool(torch.rand((), generator=g) < 0.5)
        if self.pairs == "sop":
            a, b, label = (b, a, 1) if flip else (a, b, 0)
        elif flip:  # as long as the true next segment, so the length does not give it away
            a, b, label = a, self._random_segment(documents, d, len(b), g)[: len(b)], 1
        else:
            label = 0
        a, b = truncate_pair(a, b, self.room, g)
        return a, b, label

    def _pieces(
        self, chunks: np.ndarray, pieces: np.ndarray
    ) -> tuple[list[int], list[tuple[int, int]], list[int]]:
        """[CLS] tokens [SEP] per piece (chunk, first token, count; a whole chunk: count -1)
        -> (body, maskable ranges, each piece's first position)."""
        t = self.tok
        body: list[int] = []
        ranges, starts = [], []
        for chunk, first, count in pieces.tolist():
            tokens = self._span(chunks[chunk])
            tokens = tokens[first : first + count] if count >= 0 else tokens[: self.room]
            starts.append(len(body))
            ranges.append((len(body) + 1, len(body) + 1 + len(tokens)))
            body += [t.cls_id, *tokens.tolist(), t.sep_id]
        return body, ranges, starts

    def _sample(
        self, chunks: np.ndarray, documents: range, pieces: np.ndarray, g: torch.Generator
    ) -> dict[str, Tensor]:
        """The sample of `pieces` ([n, 3]: chunk, first token, count; see _pieces)."""
        t = self.tok
        label: int | None = None
        if self.pairs == "none":  # pieces of documents, no pair label
            body, ranges, starts = self._pieces(chunks, pieces)
            second = len(body)
        else:
            a, b, label = self._segments(chunks, documents, int(pieces[0, 0]), g)
            body = [t.cls_id, *a.tolist(), t.sep_id, *b.tolist(), t.sep_id]
            second, starts = len(a) + 2, [0]
            ranges = [(1, len(a) + 1), (second, len(body) - 1)]
        length = len(body)
        ids = torch.full((self.seq,), t.pad_id, dtype=torch.long)
        ids[:length] = torch.tensor(body)
        token_type = torch.zeros(self.seq, dtype=torch.long)
        token_type[second:length] = 1
        maskable = torch.zeros(self.seq, dtype=torch.bool)
        for lo, hi in ranges:
            maskable[lo:hi] = True
        inputs, labels = mask_tokens(
            ids,
            maskable,
            word_start=self.word_start,
            mask_id=t.mask_id,
            random_ids=self.random_ids,
            mask_prob=self.mask_prob,
            whole_word=self.whole_word,
            generator=g,
            max_predictions=self.max_predictions,
        )
        attention = torch.zeros(self.seq, dtype=torch.long)
        attention[:length] = 1
        sample = {
            "input_ids": inputs,
            "token_type_ids": token_type,
            "attention_mask": attention,
            "mlm_labels": labels,
        }
        if label is not None:
            sample["nsp_labels"] = torch.tensor(label)
        if self.train_packs is not None:  # packed: each piece's positions restart
            sample["position_ids"] = document_positions(starts, self.seq)
        return sample

    def _item(self, split: str, index: int) -> np.ndarray:
        """The pieces of sample `index` of a split (one whole chunk unless packed)."""
        train = split == "train"
        packs = self.train_packs if train else self.eval_packs
        if packs is None:
            item = self.order(index) if train else index % len(self.eval_chunks)
            return np.asarray([[item, 0, -1]], dtype=np.int64)
        pieces, offsets = packs
        item = self.order(index) if train else index % (len(offsets) - 1)
        return pieces[offsets[item] : offsets[item + 1]]

    def sample(self, index: int, *, split: str = "train") -> dict[str, Tensor]:
        pieces = self._item(split, index)
        if split == "train":
            g = torch.Generator().manual_seed(derive_seed(self.seed, index, _SAMPLE))
            return self._sample(self.train_chunks, self.train_docs, pieces, g)
        g = torch.Generator().manual_seed(derive_seed(self.seed, index, _EVAL))
        return self._sample(self.eval_chunks, self.eval_docs, pieces, g)

    def batch(self, indices: Sequence[int], *, split: str = "train") -> dict[str, Tensor]:
        samples = [self.sample(i, split=split) for i in indices]
        return {k: torch.stack([s[k] for s in samples]) for k in samples[0]}


__all__ = ["IGNORE", "BertPretrainingDataset", "EpochOrder", "document_positions"]
