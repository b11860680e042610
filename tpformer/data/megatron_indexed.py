"""Megatron-LM's indexed datasets (`<prefix>.bin` + `<prefix>.idx`, the "MMIDIDX" format that
megatron-core's IndexedDatasetBuilder and Megatron-LM's tools/preprocess_data.py write), read in
place, memory-mapped, as a TokenCorpus:

    .idx  b"MMIDIDX\\x00\\x00", version <Q = 1, dtype code <B, sequence count <Q,
          document count <Q, then int32 sequence lengths, int64 sequence byte pointers and
          int64 document indices (sequence offsets, starting at 0)
    .bin  the sequences' token ids back to back

A sequence is a sentence (Megatron's BERT preprocessing, --split-sentences) or a whole document
(its GPT preprocessing, with the EOD token appended by --append-eod): either way the documents
are the index's, and a causal LM adds no BOS/EOS of its own.
"""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np

from tpformer.data.indexed import TokenCorpus

HEADER = b"MMIDIDX\x00\x00"
_DTYPES = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64, 8: np.uint16}
_FIXED = len(HEADER) + 8 + 1 + 8 + 8


def megatron_prefix(path: str | Path) -> Path:
    """The prefix of a Megatron dataset named by its prefix or by its .bin/.idx file."""
    path = Path(path).expanduser()
    return path.with_suffix("") if path.suffix in (".bin", ".idx") else path


def is_megatron(prefix: str | Path) -> bool:
    idx = Path(f"{megatron_prefix(prefix)}.idx")
    if not idx.is_file():
        return False
    with open(idx, "rb") as f:
        return f.read(len(HEADER)) == HEADER


class MegatronCorpus(TokenCorpus):
    """A Megatron-LM indexed dataset; a file that is not one fails naming what was expected."""

    adds_document_tokens = False
    remedy = "the Megatron dataset {prefix} was written with another tokenizer or is damaged"

    def __init__(self, prefix: str | Path) -> None:
        self.prefix = megatron_prefix(prefix)
        idx, bin_file = Path(f"{self.prefix}.idx"), Path(f"{self.prefix}.bin")
        for f in (idx, bin_file):
            if not f.is_file():
                raise FileNotFoundError(
                    f"{f} is missing: data.source=megatron reads <prefix>.bin and <prefix>.idx "
                    "as megatron-core's IndexedDatasetBuilder writes them"
                )
        raw = np.memmap(idx, dtype=np.uint8, mode="r")
        dtype, sequences, documents = self._header(idx, bytes(raw[:_FIXED]))
        need = _FIXED + sequences * (4 + 8) + documents * 8
        if raw.size < need:
            raise ValueError(
                f"{idx} has {raw.size} bytes, its header ({sequences} sequences, {documents} "
                f"document indices) needs {need}: the index is truncated"
            )
        buffer = memoryview(raw)  # type: ignore[arg-type]
        lengths = np.frombuffer(buffer, np.int32, sequences, _FIXED).astype(np.int64)
        pointers = np.frombuffer(buffer, np.int64, sequences, _FIXED + 4 * sequences)
        self.doc_offsets = np.frombuffer(buffer, np.int64, documents, _FIXED + 12 * sequences)
        self.sentence_offsets = np.concatenate([[0], np.cumsum(lengths)])
        self._check(dtype, pointers, bin_file)
        total = int(self.sentence_offsets[-1])
        self.tokens = (
            np.memmap(bin_file, dtype=dtype, mode="r", shape=(total,))
            if total
            else np.zeros(0, dtype=dtype)
        )

    @staticmethod
    def _header(idx: Path, head: bytes) -> tuple[np.dtype, int, int]:
        if len(head) < _FIXED or head[: len(HEADER)] != HEADER:
            raise ValueError(
                f"{idx} is not a Megatron-LM index: it starts with {head[: len(HEADER)]!r}, "
                f"expected {HEADER!r} (megatron-core's MMIDIDX format)"
            )
        version, code, sequences, documents = struct.unpack("<QBQQ", head[len(HEADER) :])
        if version != 1:
            raise ValueError(f"{idx} is MMIDIDX version {version}; only version 1 is read")
        if code not in _DTYPES:
            raise ValueError(
                f"{idx} has token dtype code {code}; token ids need an integer dtype "
                f"(codes {sorted(_DTYPES)})"
            )
        return np.dtype(_DTYPES[code]), sequences, documents

    def _check(self, dtype: np.dtype, pointers: np.ndarray, bin_file: Path) -> None:
        starts = self.sentence_offsets[:-1] * dtype.itemsize
        if not np.array_equal(pointers, starts):
            raise ValueError(
                f"{self.prefix}.idx points at sequences that are not back to back in "
                f"{bin_file}: only indices written by one builder (or merged with add_index) "
                "are read"
            )
        docs = self.doc_offsets
        if len(docs) < 2 or docs[0] != 0 or docs[-1] != len(pointers) or np.any(np.diff(docs) < 0):
            raise ValueError(
                f"{self.prefix}.idx has document indices {docs[:3].tolist()}..."
                f"{docs[-2:].tolist()} for {len(pointers)} sequences: expected 0, ..., "
                f"{len(pointers)} rising (call end_document() after each document)"
            )
        expected = int(self.sentence_offsets[-1]) * dtype.itemsize
        size = bin_file.stat().st_size
        if size != expected:
            raise ValueError(
                f"{bin_file} has {size} bytes, its index expects {expected} "
                f"({self.sentence_offsets[-1]} tokens of {dtype.name}): the .bin does not "
                "belong to this .idx or is truncated"
            )
