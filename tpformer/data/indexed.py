"""Memory-mapped token files: `<prefix>.bin` holds every sentence's ids back to back,
`<prefix>.idx.npz` the sentence and document boundaries, `<prefix>.json` what was read.

    tokens[sentence_offsets[i]:sentence_offsets[i + 1]]       sentence i
    sentences doc_offsets[d] .. doc_offsets[d + 1] - 1          document d

The writer streams to disk, so the token file never has to fit in memory; readers map it.
"""

from __future__ import annotations

import json
import os
import shutil
from array import array
from itertools import chain
from pathlib import Path

import numpy as np

from tpformer.data.tokenizer import TokenizedBatch


def token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16 if vocab_size <= np.iinfo(np.uint16).max + 1 else np.int32)


class IndexedWriter:
    """Append documents (lists of tokenized sentences); `finish` makes the files visible."""

    def __init__(self, prefix: Path, vocab_size: int) -> None:
        self.prefix, self.dtype = prefix, token_dtype(vocab_size)
        prefix.parent.mkdir(parents=True, exist_ok=True)
        self._tmp = Path(f"{prefix}.bin.tmp{os.getpid()}")
        self._file = open(self._tmp, "wb")  # noqa: SIM115 - open across add() calls, closed by finish()
        self._sentences = array("q", [0])
        self._docs = array("q", [0])

    def add(self, sentences: list[list[int]]) -> None:
        """One document: its sentences' ids, written with one call."""
        lengths = [len(s) for s in sentences if s]
        if not lengths:
            return
        flat = np.fromiter(chain.from_iterable(sentences), dtype=self.dtype, count=sum(lengths))
        self._file.write(flat.tobytes())
        end = self._sentences[-1]
        for n in lengths:
            end += n
            self._sentences.append(end)
        self._docs.append(len(self._sentences) - 1)

    def add_batch(self, batch: TokenizedBatch) -> None:
        """Several documents at once (Tokenizer.encode_corpus's): one write, the index extended
        by vectorized sums; empty sentences and documents are dropped."""
        keep = batch.sentence_lengths > 0
        doc_of = np.repeat(np.arange(len(batch.doc_sentences)), batch.doc_sentences)
        counts = np.bincount(doc_of[keep], minlength=len(batch.doc_sentences))
        self._file.write(batch.flat.astype(self.dtype).tobytes())
        ends = np.cumsum(batch.sentence_lengths[keep]) + self._sentences[-1]
        base = len(self._sentences) - 1
        self._sentences.extend(ends.tolist())
        self._docs.extend((np.cumsum(counts[counts > 0]) + base).tolist())

    def add_corpus(self, part: IndexedCorpus) -> None:
        """Append a finished corpus (a shard): its token file copied, its index shifted."""
        with open(f"{part.prefix}.bin", "rb") as f:
            shutil.copyfileobj(f, self._file, 1 << 24)
        base_tokens, base_sentences = self._sentences[-1], len(self._sentences) - 1
        self._sentences.extend((part.sentence_offsets[1:] + base_tokens).tolist())
        self._docs.extend((part.doc_offsets[1:] + base_sentences).tolist())

    @property
    def num_tokens(self) -> int:
        return self._sentences[-1]

    @property
    def num_documents(self) -> int:
        return len(self._docs) - 1

    def finish(self, meta: dict[str, object]) -> None:
        """Index and meta written, then the token file renamed into place: all or nothing."""
        self._file.close()
        np.savez(
            f"{self.prefix}.idx.tmp.npz",
            sentence_offsets=np.frombuffer(self._sentences, np.int64),
            doc_offsets=np.frombuffer(self._docs, np.int64),
        )
        os.replace(f"{self.prefix}.idx.tmp.npz", f"{self.prefix}.idx.npz")
        os.replace(self._tmp, f"{self.prefix}.bin")
        info = {
            **meta,
            "dtype": self.dtype.name,
            "num_tokens": self.num_tokens,
            "num_sentences": len(self._sentences) - 1,
            "num_documents": self.num_documents,
        }
        Path(f"{self.prefix}.json.tmp").write_text(json.dumps(info, indent=1))
        os.replace(f"{self.prefix}.json.tmp", f"{self.prefix}.json")  # last: marks completion

    def abort(self) -> None:
        self._file.close()
        self._tmp.unlink(missing_ok=True)


class TokenCorpus:
    """Read side shared by every token-file format: sentences and documents, memory-mapped.

    Subclasses set prefix, tokens (1-D ids), sentence_offsets (n + 1 token offsets) and
    doc_offsets (d + 1 sentence offsets)."""

    prefix: Path
    tokens: np.ndarray
    sentence_offsets: np.ndarray
    doc_offsets: np.ndarray
    adds_document_tokens = True
    """Whether a causal LM puts each document between the tokenizer's BOS and EOS (false when
    the file already holds the separators its preprocessing wrote)."""
    remedy = "delete {prefix}.* and rerun"
    """What to do about a bad file (this format's files can be regenerated)."""

    def check_token_ids(self, vocab_size: int, *, chunk: int = 1 << 24) -> None:
        """Every token id is below vocab_size (a corpus tokenized with another tokenizer, or a
        damaged token file, would otherwise embed out-of-range ids)."""
        for start in range(0, len(self.tokens), chunk):
            part = self.tokens[start : start + chunk]
            top = int(part.max())
            if top >= vocab_size:
                at = start + int(np.argmax(part >= vocab_size))
                raise ValueError(
                    f"{self.prefix}.bin holds token id {int(self.tokens[at])} at "
                    f"position {at}, outside model.vocab_size={vocab_size}: the "
                    f"corpus was tokenized for another vocabulary or is damaged; "
                    + self.remedy.format(prefix=self.prefix)
                )

    @property
    def num_documents(self) -> int:
        return len(self.doc_offsets) - 1

    @property
    def num_tokens(self) -> int:
        return int(self.sentence_offsets[-1])

    def sentence_lengths(self) -> np.ndarray:
        return np.diff(self.sentence_offsets)

    def sentence(self, i: int) -> np.ndarray:
        return self.tokens[self.sentence_offsets[i] : self.sentence_offsets[i + 1]]

    def span(self, first: int, end: int) -> np.ndarray:
        """Tokens of sentences [first, end) as one array."""
        return self.tokens[self.sentence_offsets[first] : self.sentence_offsets[end]]

    def document(self, d: int) -> list[np.ndarray]:
        return [self.sentence(i) for i in range(self.doc_offsets[d], self.doc_offsets[d + 1])]


class IndexedCorpus(TokenCorpus):
    """tpformer's own token files (<prefix>.bin, .idx.npz, .json), as preprocess() writes them."""

    def __init__(self, prefix: Path) -> None:
        self.prefix = Path(prefix)
        meta_file = Path(f"{prefix}.json")
        if not meta_file.is_file():
            raise FileNotFoundError(
                f"{meta_file} is missing: {prefix} is not a complete "
                f"preprocessed corpus (rerun tools/preprocess_data.py)"
            )
        try:
            self.meta = json.loads(meta_file.read_text())
            index = np.load(f"{prefix}.idx.npz")
            self.sentence_offsets = index["sentence_offsets"]
            self.doc_offsets = index["doc_offsets"]
            dtype = np.dtype(self.meta["dtype"])
        except Exception as err:  # JSON, zip, numpy: one message for all
            raise ValueError(
                f"the preprocessed corpus {prefix} is unreadable ({type(err).__name__}: "
                f"{err}); delete {prefix}.* and rerun"
            ) from None
        bin_file = Path(f"{prefix}.bin")
        expected = int(self.sentence_offsets[-1]) * dtype.itemsize
        size = bin_file.stat().st_size if bin_file.is_file() else -1
        if size != expected:
            raise ValueError(
                f"{bin_file} has {size} bytes, its index expects {expected}: the "
                f"preprocessed corpus is corrupt; delete {prefix}.* and rerun"
            )
        self.tokens = (
            np.memmap(bin_file, dtype=dtype, mode="r") if expected else np.zeros(0, dtype=dtype)
        )
