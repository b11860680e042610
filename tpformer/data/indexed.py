"""Memory-mapped token files: `<prefix>.bin` holds every sentence's ids back to back,
`<prefix>.sentences.npy` and `<prefix>.documents.npy` the sentence and document boundaries,
`<prefix>.json` what was read.

    tokens[sentence_offsets[i]:sentence_offsets[i + 1]]       sentence i
    sentences doc_offsets[d] .. doc_offsets[d + 1] - 1          document d

The writer streams all three to disk, so its memory does not grow with the corpus; readers map
them.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
from pathlib import Path
from typing import BinaryIO

import numpy as np

from tpformer.data.tokenizer import TokenizedBatch

INDEX_FILES = ("sentences", "documents")
_NPY_HEADER = 128
"""Bytes of an index file's .npy header: fixed, so it is rewritten in place once the count is
known."""


def token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16 if vocab_size <= np.iinfo(np.uint16).max + 1 else np.int32)


def _npy_header(count: int) -> bytes:
    """A .npy (version 1.0) header of a 1-D little-endian int64 array, _NPY_HEADER bytes."""
    text = f"{{'descr': '<i8', 'fortran_order': False, 'shape': ({count},), }}"
    body = text.ljust(_NPY_HEADER - 10 - 1) + "\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(body)) + body.encode("latin1")


class _OffsetsFile:
    """An int64 offsets array appended to a .npy file as it grows (it starts with 0)."""

    def __init__(self, path: Path) -> None:
        self.path, self.count, self.last = path, 1, 0
        self.file: BinaryIO = open(path, "wb")  # noqa: SIM115 - closed by close()
        self.file.write(_npy_header(0))
        self.file.write(np.zeros(1, dtype="<i8").tobytes())

    def append(self, ends: np.ndarray) -> None:
        if len(ends):
            self.file.write(np.ascontiguousarray(ends, dtype="<i8").tobytes())
            self.count, self.last = self.count + len(ends), int(ends[-1])

    def close(self) -> None:
        self.file.seek(0)
        self.file.write(_npy_header(self.count))
        self.file.close()


class IndexedWriter:
    """Append tokenized documents (add_batch) or finished corpora (add_corpus); `finish` makes
    the files visible."""

    def __init__(self, prefix: Path, vocab_size: int) -> None:
        self.prefix, self.dtype = prefix, token_dtype(vocab_size)
        prefix.parent.mkdir(parents=True, exist_ok=True)
        pid = os.getpid()
        self._tmp = Path(f"{prefix}.bin.tmp{pid}")
        self._file = open(self._tmp, "wb")  # noqa: SIM115 - open across add() calls, closed by finish()
        self._sentences = _OffsetsFile(Path(f"{prefix}.sentences.npy.tmp{pid}"))
        self._docs = _OffsetsFile(Path(f"{prefix}.documents.npy.tmp{pid}"))

    def _append(self, sentence_lengths: np.ndarray, doc_sentences: np.ndarray) -> None:
        self._docs.append(np.cumsum(doc_sentences) + self._sentences.count - 1)
        self._sentences.append(np.cumsum(sentence_lengths) + self._sentences.last)

    def add_batch(self, batch: TokenizedBatch) -> None:
        """Several documents at once (Tokenizer.encode_corpus's): one write, the index extended
        by vectorized sums; empty sentences and documents are dropped."""
        keep = batch.sentence_lengths > 0
        doc_of = np.repeat(np.arange(len(batch.doc_sentences)), batch.doc_sentences)
        counts = np.bincount(doc_of[keep], minlength=len(batch.doc_sentences))
        self._file.write(batch.flat.astype(self.dtype).tobytes())
        self._append(batch.sentence_lengths[keep], counts[counts > 0])

    def add_corpus(self, part: IndexedCorpus, chunk: int = 1 << 22) -> None:
        """Append a finished corpus (a shard): its token file copied, its index shifted, a
        chunk at a time."""
        with open(f"{part.prefix}.bin", "rb") as f:
            shutil.copyfileobj(f, self._file, 1 << 24)
        base_tokens, base_sentences = self._sentences.last, self._sentences.count - 1
        for offsets, base, out in (
            (part.doc_offsets, base_sentences, self._docs),
            (part.sentence_offsets, base_tokens, self._sentences),
        ):
            for at in range(1, len(offsets), chunk):
                out.append(np.asarray(offsets[at : at + chunk]) + base)

    @property
    def num_tokens(self) -> int:
        return self._sentences.last

    @property
    def num_documents(self) -> int:
        return self._docs.count - 1

    def finish(self, meta: dict[str, object]) -> None:
        """Index and meta written, then the token file renamed into place: all or nothing."""
        self._file.close()
        for offsets, name in ((self._sentences, "sentences"), (self._docs, "documents")):
            offsets.close()
            os.replace(offsets.path, f"{self.prefix}.{name}.npy")
        os.replace(self._tmp, f"{self.prefix}.bin")
        info = {
            **meta,
            "dtype": self.dtype.name,
            "num_tokens": self.num_tokens,
            "num_sentences": self._sentences.count - 1,
            "num_documents": self.num_documents,
        }
        Path(f"{self.prefix}.json.tmp").write_text(json.dumps(info, indent=1))
        os.replace(f"{self.prefix}.json.tmp", f"{self.prefix}.json")  # last: marks completion

    def abort(self) -> None:
        self._file.close()
        self._tmp.unlink(missing_ok=True)
        for offsets in (self._sentences, self._docs):
            offsets.file.close()
            offsets.path.unlink(missing_ok=True)


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
    """tpformer's own token files (<prefix>.bin, .sentences.npy, .documents.npy, .json), as
    preprocess() writes them."""

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
            self.sentence_offsets = np.load(f"{prefix}.sentences.npy", mmap_mode="r")
            self.doc_offsets = np.load(f"{prefix}.documents.npy", mmap_mode="r")
            dtype = np.dtype(self.meta["dtype"])
            self._check_index()
        except Exception as err:  # JSON, numpy, the checks: one message for all
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

    def _check_index(self, chunk: int = 1 << 22, full: int = 1 << 26) -> None:
        """The offsets are as many as the meta says, start at 0, end at the totals and never
        fall (a damaged index would cut sentences at random). Read a chunk at a time from the
        file, not the map, so the check leaves nothing resident; an index of more than `full`
        entries (a corpus of about 1 billion tokens) is checked at its first and last chunks."""
        for offsets, key, top, name in (
            (self.sentence_offsets, "num_sentences", self.meta["num_tokens"], "sentences"),
            (self.doc_offsets, "num_documents", self.meta["num_sentences"], "documents"),
        ):
            n = len(offsets)
            if n != self.meta[key] + 1 or offsets[0] != 0 or offsets[-1] != top:
                raise ValueError(f"its {name} index does not match {self.prefix}.json")
            starts = range(0, n - 1, chunk) if n <= full else (0, max(0, n - 1 - chunk))
            for at in starts:
                part = np.fromfile(
                    f"{self.prefix}.{name}.npy", dtype="<i8", count=min(chunk + 1, n - at),
                    offset=_NPY_HEADER + 8 * at,
                )  # fmt: skip
                if np.any(np.diff(part) < 0):
                    raise ValueError(f"its {name} index falls near entry {at}")
