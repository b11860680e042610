"""Tokenizers: a sentencepiece model trained here (BERT's special tokens at fixed ids 0-4), a
Hugging Face WordPiece directory (vocab.txt) for continuing from HF checkpoints, or a Hugging
Face tokenizer.json (byte-level BPE, as Llama 3, GPT-2, Qwen and ModernBERT ship) whose special
tokens and BOS/EOS come from its tokenizer_config.json.

All expose the same small surface: encode, the special ids, which ids start a word (for
whole-word masking), a causal LM's document BOS/EOS and the files to copy into a checkpoint.
"""

from __future__ import annotations

import hashlib
import io
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import chain
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from tpformer.data.corpus import SENTENCE_END_CHARS, split_sentences

if TYPE_CHECKING:
    import tokenizers

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
"""Fixed ids 0..4 in every sentencepiece model trained by tpformer."""
SP_FILE = "tokenizer.model"
HF_JSON = "tokenizer.json"
HF_FILES = (HF_JSON, "tokenizer_config.json", "special_tokens_map.json")
MAX_TRAINING_SENTENCES = 2_000_000
"""Sentencepiece samples this many sentences of a larger corpus for training."""


@dataclass
class TokenizedBatch:
    """Documents as token ids: `flat`, cut into sentences of `sentence_lengths`, grouped into
    documents of `doc_sentences` sentences each."""

    flat: np.ndarray
    sentence_lengths: np.ndarray
    doc_sentences: np.ndarray

    @staticmethod
    def of(documents: Sequence[Sequence[Sequence[int]]]) -> TokenizedBatch:
        sentences = [s for d in documents for s in d]
        lengths = np.fromiter(map(len, sentences), dtype=np.int64, count=len(sentences))
        flat = np.fromiter(chain.from_iterable(sentences), dtype=np.int64, count=int(lengths.sum()))
        counts = np.fromiter(map(len, documents), dtype=np.int64, count=len(documents))
        return TokenizedBatch(flat, lengths, counts)


class Tokenizer:
    """Encode text to ids; knows its special ids and word starts."""

    bos_id: int | None = None
    eos_id: int | None = None
    """A causal LM's document start and end (a tokenizer.json's bos/eos tokens; None: none)."""
    absent: tuple[str, ...] = ()
    """BERT's special tokens a tokenizer.json lacks (their ids are -1)."""
    threads: int = -1
    """sentencepiece's encode threads (-1: all cores); a preprocessing worker sets 1, the
    workers being the parallelism."""

    @staticmethod
    def _document_texts(texts: list[str]) -> list[str]:
        """The texts encoded for one document's sentences (byte-level BPE adds spaces)."""
        return texts

    def __init__(self, path: Path) -> None:
        path = Path(path).expanduser()
        if path.is_dir() and (path / SP_FILE).is_file():
            path = path / SP_FILE
        if path.is_dir() and not (path / "vocab.txt").is_file() and (path / HF_JSON).is_file():
            path = path / HF_JSON
        if path.is_file() and path.suffix == ".model":
            self._load_sentencepiece(path)
        elif path.is_dir() and (path / "vocab.txt").is_file():
            self._load_wordpiece(path)
        elif path.is_file() and path.suffix == ".json":
            self._load_hf_json(path)
        else:
            raise FileNotFoundError(
                f"data.tokenizer={str(path)!r} is neither a sentencepiece model ({SP_FILE}), a "
                f"directory with a WordPiece vocab.txt, nor a Hugging Face {HF_JSON}"
            )
        self.path = path

    def _load_sentencepiece(self, path: Path) -> None:
        import sentencepiece as spm

        try:
            self._sp = spm.SentencePieceProcessor(model_file=str(path))
        except (RuntimeError, OSError) as err:
            raise ValueError(f"{path} is not a readable sentencepiece model ({err})") from None
        pieces = [self._sp.id_to_piece(i) for i in range(self._sp.get_piece_size())]
        if tuple(pieces[:5]) != SPECIAL_TOKENS:
            raise ValueError(
                f"{path} has {pieces[:5]} at ids 0-4; tpformer needs {SPECIAL_TOKENS} "
                f"(train it with tools/train_tokenizer.py)"
            )
        self.vocab_size = len(pieces)
        self.pad_id, self.unk_id, self.cls_id, self.sep_id, self.mask_id = range(5)
        self.word_start = torch.tensor([p.startswith("\u2581") for p in pieces])
        self._ends_sentence = np.array(
            [p.endswith(SENTENCE_END_CHARS) and i >= 5 for i, p in enumerate(pieces)]
        )
        self.files = [path]
        self._encode = lambda texts: self._sp.encode(list(texts), num_threads=self.threads)

    def _load_wordpiece(self, path: Path) -> None:
        tok = _wordpiece_backend(path)
        tok.no_truncation()  # data/glue truncates pairs itself; a tokenizer.json may set both
        tok.no_padding()
        ids = [tok.token_to_id(t) for t in SPECIAL_TOKENS]
        missing = [t for t, i in zip(SPECIAL_TOKENS, ids) if i is None]
        if missing:
            raise ValueError(
                f"the WordPiece vocabulary in {path} lacks {missing}; a BERT "
                f"vocabulary holds {list(SPECIAL_TOKENS)}"
            )
        self.pad_id, self.unk_id, self.cls_id, self.sep_id, self.mask_id = (
            int(i) for i in ids if i is not None
        )
        self.vocab_size = tok.get_vocab_size()
        pieces = [tok.id_to_token(i) for i in range(self.vocab_size)]
        self.word_start = torch.tensor([not (p or "").startswith("##") for p in pieces])
        self.files = [
            path / f
            for f in os.listdir(path)
            if f
            in ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
        ]
        self._encode = lambda texts: [
            e.ids for e in tok.encode_batch(list(texts), add_special_tokens=False)
        ]

    def _load_hf_json(self, path: Path) -> None:
        """A tokenizer.json; its tokenizer_config.json beside it names the special tokens."""
        import json

        from tokenizers import Tokenizer as Backend

        try:
            tok = Backend.from_file(str(path))
        except Exception as err:  # tokenizers raises its own Exception subclass
            raise ValueError(f"{path} is not a readable Hugging Face tokenizer ({err})") from None
        tok.no_truncation()
        tok.no_padding()
        config_file = path.parent / "tokenizer_config.json"
        config = json.loads(config_file.read_text()) if config_file.is_file() else {}

        def special(role: str) -> int | None:
            token = config.get(f"{role}_token")
            token = token.get("content") if isinstance(token, dict) else token
            found = tok.token_to_id(token) if isinstance(token, str) else None
            return None if found is None else int(found)

        self.bos_id, self.eos_id = special("bos"), special("eos")
        roles = {r: special(r) for r in ("pad", "unk", "cls", "sep", "mask")}
        if roles["pad"] is None:  # a decoder's batches pad with its end of text
            roles["pad"] = self.eos_id
        self.absent = tuple(f"{r}_token" for r, i in roles.items() if i is None)
        self.pad_id, self.unk_id, self.cls_id, self.sep_id, self.mask_id = (
            -1 if i is None else i for i in roles.values()
        )
        self.vocab_size = tok.get_vocab_size()
        pieces = [tok.id_to_token(i) or "" for i in range(self.vocab_size)]
        self.word_start = torch.tensor([p.startswith(("\u0120", "\u2581")) for p in pieces])
        self.files = [path.parent / f for f in os.listdir(path.parent) if f in HF_FILES]
        byte_level = "ByteLevel" in json.dumps(json.loads(path.read_text()).get("pre_tokenizer"))

        if byte_level:  # a document's later sentences keep the space before them
            self._document_texts = lambda texts: texts[:1] + [" " + t for t in texts[1:]]  # type: ignore[method-assign]
        self._encode = lambda texts: [
            e.ids for e in tok.encode_batch(list(texts), add_special_tokens=False)
        ]

    def check_bert_specials(self) -> None:
        """BERT's samples need [PAD], [CLS], [SEP] and [MASK] (and [UNK] to exist)."""
        if self.absent:
            raise ValueError(
                f"tokenizer {self.path} has no {', '.join(self.absent)} in its "
                "tokenizer_config.json: BERT pretraining and fine-tuning need pad, unk, cls, "
                "sep and mask tokens"
            )

    @property
    def special_ids(self) -> list[int]:
        ids = [self.pad_id, self.unk_id, self.cls_id, self.sep_id, self.mask_id]
        return [i for i in (*ids, self.bos_id, self.eos_id) if i is not None and i >= 0]

    def encode(self, texts: Iterable[str]) -> list[list[int]]:
        """Token ids of each text (the sentences of one document), without special tokens."""
        return self._encode(self._document_texts(list(texts)))

    def encode_corpus(self, documents: Sequence[str]) -> TokenizedBatch:
        """Documents' ids, sentence-split as corpus.split_sentences splits them, as one flat
        array with the sentence lengths and each document's sentence count (preprocessing's
        hot path). A sentencepiece model encodes whole lines and finds the sentence ends in the
        ids (a piece never spans whitespace, so the ids are the per-sentence ones); other
        tokenizers encode each sentence."""
        if not hasattr(self, "_sp"):
            per_document = self.encode_documents([split_sentences(d) for d in documents])
            return TokenizedBatch.of(per_document)
        lines, per_line = [], []
        for document in documents:
            kept = [line for line in document.split("\n") if line.strip()]
            lines += kept
            per_line.append(len(kept))
        ids = self._sp.encode(lines, num_threads=self.threads)
        line_lengths = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
        flat = np.fromiter(chain.from_iterable(ids), dtype=np.int64, count=int(line_lengths.sum()))
        starts = np.zeros(len(flat), dtype=bool)
        starts[np.cumsum(line_lengths)[:-1][line_lengths[1:] > 0]] = True  # each line's start
        if len(flat):
            starts[0] = True
            inner = self.word_start.numpy()[flat[1:]] & self._ends_sentence[flat[:-1]]
            starts[1:] |= inner
        first = np.flatnonzero(starts)
        sentence_lengths = np.diff(np.append(first, len(flat)))
        # sentences per line, then per document
        line_of_sentence = np.searchsorted(np.cumsum(line_lengths), first, side="right")
        per_line_count = np.bincount(line_of_sentence, minlength=len(lines))
        line_doc = np.repeat(np.arange(len(documents)), per_line)
        doc_counts = np.bincount(line_doc, weights=per_line_count, minlength=len(documents))
        return TokenizedBatch(flat, sentence_lengths, doc_counts.astype(np.int64))

    def encode_documents(self, documents: Sequence[list[str]]) -> list[list[list[int]]]:
        """encode() of each document (its sentences), in one batch call."""
        ids = self._encode([t for d in documents for t in self._document_texts(d)])
        out, at = [], 0
        for d in documents:
            out.append(ids[at : at + len(d)])
            at += len(d)
        return out

    def fingerprint(self) -> str:
        h = hashlib.sha256()
        for file in sorted(self.files):
            h.update(file.name.encode() + file.read_bytes())
        return h.hexdigest()

    def check_vocab(self, model_vocab_size: int) -> None:
        """The model's embedding must have exactly one row per token id."""
        if self.vocab_size != model_vocab_size:
            raise ValueError(
                f"tokenizer {self.path} has {self.vocab_size} tokens but "
                f"model.vocab_size={model_vocab_size}; set "
                f"model.vocab_size={self.vocab_size} or use another tokenizer"
            )


_NORMALIZER_KEYS = {
    "do_lower_case": "lowercase",
    "strip_accents": "strip_accents",
    "tokenize_chinese_chars": "handle_chinese_chars",
}
"""tokenizer_config.json's options and the BertNormalizer fields of tokenizer.json they set."""


def _wordpiece_backend(path: Path) -> tokenizers.Tokenizer:
    """The `tokenizers` tokenizer that transformers' BertTokenizerFast would run for `path`:
    read from tokenizer.json directly when tokenizer_config.json agrees with its normalizer
    (what BertTokenizerFast checks before rebuilding it), which spares importing transformers
    (about 0.8 s of every fine-tuning start); otherwise built by BertTokenizerFast."""
    file = path / "tokenizer.json"
    if file.is_file():
        import json

        from tokenizers import Tokenizer as Backend

        normalizer = json.loads(file.read_text()).get("normalizer") or {}
        config_file = path / "tokenizer_config.json"
        config = json.loads(config_file.read_text()) if config_file.is_file() else {}
        if normalizer.get("type") == "BertNormalizer" and all(
            normalizer.get(field) == config[key]
            for key, field in _NORMALIZER_KEYS.items()
            if key in config
        ):
            return Backend.from_file(str(file))
    from transformers import BertTokenizerFast  # type: ignore[attr-defined]  # lazy module

    return BertTokenizerFast.from_pretrained(str(path)).backend_tokenizer


def train_sentencepiece(
    sentences: Iterable[str],
    out_dir: Path,
    *,
    vocab_size: int,
    model_type: str = "bpe",
    threads: int = 2,
) -> Path:
    """Train a sentencepiece model with SPECIAL_TOKENS at ids 0-4; writes out_dir/tokenizer.model
    atomically and returns its path."""
    import sentencepiece as spm

    buffer = io.BytesIO()
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(sentences),
            model_writer=buffer,
            vocab_size=vocab_size,
            model_type=model_type,
            pad_id=0,
            pad_piece="[PAD]",
            unk_id=1,
            unk_piece="[UNK]",
            bos_id=-1,
            eos_id=-1,
            user_defined_symbols=list(SPECIAL_TOKENS[2:]),
            input_sentence_size=MAX_TRAINING_SENTENCES,
            shuffle_input_sentence=True,
            num_threads=threads,
            minloglevel=2,
        )
    except RuntimeError as err:
        raise ValueError(
            f"training a {model_type} sentencepiece model of vocab_size={vocab_size} "
            f"failed: {str(err).strip()}"
        ) from None
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / SP_FILE
    tmp = out_dir / f".{SP_FILE}.{os.getpid()}"
    tmp.write_bytes(buffer.getvalue())
    os.replace(tmp, target)
    return target
