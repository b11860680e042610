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

_ORDER, _SAMPLE, _EVAL = 0x0DE5, 0x5A3E, 0xE7A1


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
    length) and MLM labels only (RoBERTa's and ModernBERT's recipe)."""

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
    ) -> None:
        tokenizer.check_bert_specials()
        self.corpus, self.tok, self.seq, self.seed = corpus, tokenizer, seq_length, seed
        self.mask_prob, self.whole_word, self.pairs = mask_prob, whole_word, sentence_pairs
        train_docs, eval_docs = split_documents(corpus, eval_fraction)
        check_corpus_size(corpus, train_docs, seq_length)
        room = seq_length - (2 if sentence_pairs == "none" else 3)
        self.train_chunks = pack_chunks(corpus, train_docs, room)
        self.eval_chunks = (
            pack_chunks(corpus, eval_docs, room) if len(eval_docs) else self.train_chunks
        )
        self.order = EpochOrder(len(self.train_chunks), seed)
        special = torch.zeros(tokenizer.vocab_size, dtype=torch.bool)
        special[tokenizer.special_ids] = True
        self.random_ids = (~special).nonzero().flatten()
        self.word_start = tokenizer.word_start

    def __len__(self) -> int:
        return len(self.train_chunks)

    def _span(self, row: np.ndarray) -> np.ndarray:
        return self.corpus.span(int(row[1]), int(row[2]))

    def _segments(
        self, chunks: np.ndarray, item: int, g: torch.Generator
    ) -> tuple[np.ndarray, np.ndarray, int]:
        d, first, end = (int(x) for x in chunks[item])
        if end - first >= 2:
            cut = int(torch.randint(first + 1, end, (1,), generator=g))
            a, b = self.corpus.span(first, cut), self.corpus.span(cut, end)
        else:
            tokens = self.corpus.span(first, end)
            a, b = tokens[: len(tokens) // 2], tokens[len(tokens) // 2 :]
        flip = bool(torch.rand((), generator=g) < 0.5)
        if not flip:
            return a, b, 0
        if self.pairs == "sop":
            return b, a, 1
        for _ in range(10):  # a random segment from another document (another chunk if only one)
            other = int(torch.randint(0, len(chunks), (1,), generator=g))
            if other != item and (
                chunks[other, 0] != d or chunks[:, 0].min() == chunks[:, 0].max()
            ):
                # as long as the true next segment, so padding does not give the label away
                return a, self._span(chunks[other])[: len(b)], 1
        return a, b, 0

    def _sample(self, chunks: np.ndarray, item: int, g: torch.Generator) -> dict[str, Tensor]:
        if self.pairs == "none":  # one segment, no pair label
            tokens = self._span(chunks[item])
            a, b, label = tokens[: self.seq - 2], tokens[:0], None
        else:
            a, b, label = self._segments(chunks, item, g)
        la, lb, room = len(a), len(b), self.seq - (3 if label is not None else 2)
        while la + lb > room:  # trim the longer segment from its end
            if la > lb:
                la -= 1
            else:
                lb -= 1
        t = self.tok
        body = [t.cls_id, *a[:la].tolist(), t.sep_id]
        if label is not None:
            body += [*b[:lb].tolist(), t.sep_id]
        length = len(body)
        ids = torch.full((self.seq,), t.pad_id, dtype=torch.long)
        ids[:length] = torch.tensor(body)
        token_type = torch.zeros(self.seq, dtype=torch.long)
        token_type[la + 2 : length] = 1
        maskable = torch.zeros(self.seq, dtype=torch.bool)
        maskable[1 : la + 1] = True
        maskable[la + 2 : length - 1] = True
        inputs, labels = mask_tokens(
            ids,
            maskable,
            word_start=self.word_start,
            mask_id=t.mask_id,
            random_ids=self.random_ids,
            mask_prob=self.mask_prob,
            whole_word=self.whole_word,
            generator=g,
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
        return sample

    def sample(self, index: int, *, split: str = "train") -> dict[str, Tensor]:
        if split == "train":
            g = torch.Generator().manual_seed(derive_seed(self.seed, index, _SAMPLE))
            return self._sample(self.train_chunks, self.order(index), g)
        g = torch.Generator().manual_seed(derive_seed(self.seed, index, _EVAL))
        return self._sample(self.eval_chunks, index % len(self.eval_chunks), g)

    def batch(self, indices: Sequence[int], *, split: str = "train") -> dict[str, Tensor]:
        samples = [self.sample(i, split=split) for i in indices]
        return {k: torch.stack([s[k] for s in samples]) for k in samples[0]}


class DocumentStream:
    """The token stream of documents [first, stop) of a corpus, each between the tokenizer's
    BOS and EOS when it has them (Llama's and GPT-2's convention): windows are read from it
    without materializing it (vectorized, per window)."""

    def __init__(
        self, corpus: TokenCorpus, documents: range, bos: int | None, eos: int | None
    ) -> None:
        self.tokens, self.bos, self.eos = corpus.tokens, bos, eos
        starts = corpus.sentence_offsets[corpus.doc_offsets[documents.start : documents.stop + 1]]
        self.doc_starts = np.asarray(starts[:-1], dtype=np.int64)
        self.doc_lengths = np.diff(starts).astype(np.int64)
        extra = (bos is not None) + (eos is not None)
        self.stream_starts = np.concatenate([[0], np.cumsum(self.doc_lengths + extra)])
        self.plain = extra == 0  # one slice of the token file

    def __len__(self) -> int:
        return int(self.stream_starts[-1])

    def window(self, start: int, length: int) -> Tensor:
        if self.plain:
            first = int(self.doc_starts[0]) + start if len(self.doc_starts) else start
            return torch.from_numpy(self.tokens[first : first + length].astype(np.int64))
        position = np.arange(start, start + length, dtype=np.int64)
        doc = np.searchsorted(self.stream_starts, position, side="right") - 1
        inside = position - self.stream_starts[doc] - (self.bos is not None)
        length_of = self.doc_lengths[doc]
        token = self.tokens[self.doc_starts[doc] + np.clip(inside, 0, length_of - 1)]
        out = token.astype(np.int64)
        if self.bos is not None:
            out[inside < 0] = self.bos
        if self.eos is not None:
            out[inside >= length_of] = self.eos
        return torch.from_numpy(out)


class CausalLMDataset:
    """GPT samples: consecutive seq_length-token windows of the concatenated documents (each
    between BOS and EOS when the tokenizer has them)."""

    def __init__(
        self,
        corpus: TokenCorpus,
        *,
        seq_length: int,
        seed: int,
        eval_fraction: float,
        bos: int | None = None,
        eos: int | None = None,
    ) -> None:
        train_docs, eval_docs = split_documents(corpus, eval_fraction)
        check_corpus_size(corpus, train_docs, seq_length)
        self.seq = seq_length
        self.train = DocumentStream(corpus, train_docs, bos, eos)
        held = DocumentStream(corpus, eval_docs, bos, eos) if len(eval_docs) else None
        self.eval = held if held is not None and len(held) >= seq_length else self.train
        self.order = EpochOrder(len(self), seed)

    def __len__(self) -> int:
        return len(self.train) // self.seq

    def batch(self, indices: Sequence[int], *, split: str = "train") -> dict[str, Tensor]:
        if split == "train":
            rows = [self.train.window(self.order(i) * self.seq, self.seq) for i in indices]
        else:
            count = len(self.eval) // self.seq
            rows = [self.eval.window(i % count * self.seq, self.seq) for i in indices]
        return {"input_ids": torch.stack(rows)}


__all__ = ["IGNORE", "BertPretrainingDataset", "CausalLMDataset", "DocumentStream", "EpochOrder"]
