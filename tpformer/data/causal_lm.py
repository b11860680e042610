"""GPT samples from a preprocessed corpus: windows of the document stream, each a pure function
of (seed, global index) as BERT's are (data/pretraining.py)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor

from tpformer.data.indexed import TokenCorpus
from tpformer.data.pretraining import EpochOrder, check_corpus_size, split_documents


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

    def positions(self, start: int, length: int) -> Tensor:
        """[length] each token's place in its document (BOS included), restarting at every
        document start inside the window; the window's first document starts at 0."""
        position = np.arange(start, start + length, dtype=np.int64)
        doc = np.searchsorted(self.stream_starts, position, side="right") - 1
        return torch.from_numpy(position - np.maximum(self.stream_starts[doc], start))


class CausalLMDataset:
    """GPT samples: consecutive seq_length-token windows of the concatenated documents (each
    between BOS and EOS when the tokenizer has them); with `pack`, each window's
    `position_ids` restart at every document (the model attends within each)."""

    def __init__(
        self,
        corpus: TokenCorpus,
        *,
        seq_length: int,
        seed: int,
        eval_fraction: float,
        bos: int | None = None,
        eos: int | None = None,
        pack: bool = False,
    ) -> None:
        train_docs, eval_docs = split_documents(corpus, eval_fraction)
        check_corpus_size(corpus, train_docs, seq_length)
        self.seq, self.pack = seq_length, pack
        self.train = DocumentStream(corpus, train_docs, bos, eos)
        held = DocumentStream(corpus, eval_docs, bos, eos) if len(eval_docs) else None
        self.eval = held if held is not None and len(held) >= seq_length else self.train
        self.order = EpochOrder(len(self), seed)

    def __len__(self) -> int:
        return len(self.train) // self.seq

    def batch(self, indices: Sequence[int], *, split: str = "train") -> dict[str, Tensor]:
        if split == "train":
            stream, starts = self.train, [self.order(i) * self.seq for i in indices]
        else:
            count = len(self.eval) // self.seq
            stream, starts = self.eval, [i % count * self.seq for i in indices]
        batch = {"input_ids": torch.stack([stream.window(a, self.seq) for a in starts])}
        if self.pack:
            batch["position_ids"] = torch.stack([stream.positions(a, self.seq) for a in starts])
        return batch


__all__ = ["CausalLMDataset", "DocumentStream"]
