"""Text in and out of a causal LM: the tokenizer a tpformer checkpoint carries (its
sentencepiece model) or a Hugging Face directory's (loaded by transformers' AutoTokenizer), and
the prompt files the commands read."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Protocol

SENTENCEPIECE_FILE = "tokenizer.model"
HF_TOKENIZER_FILES = ("tokenizer.json", "vocab.json", "vocab.txt")


class TextCodec(Protocol):
    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...


class SentencePieceCodec:
    """A tpformer-trained sentencepiece model (its special tokens are never produced here)."""

    def __init__(self, path: Path) -> None:
        import sentencepiece as spm

        try:
            self.sp = spm.SentencePieceProcessor(model_file=str(path))
        except (RuntimeError, OSError) as err:
            raise ValueError(f"{path} is not a readable sentencepiece model ({err})") from None

    def encode(self, text: str) -> list[int]:
        return list(self.sp.encode(text))

    def decode(self, ids: list[int]) -> str:
        return str(self.sp.decode(ids))


class HFCodec:
    """A Hugging Face tokenizer directory, as transformers loads it."""

    def __init__(self, directory: Path) -> None:
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(str(directory))

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def decode(self, ids: list[int]) -> str:
        return str(self.tokenizer.decode(ids))


def continuation(codec: TextCodec, prompt: list[int], new: list[int]) -> str:
    """The text `new` adds after `prompt`: decoded together, less the prompt's text (a
    sentencepiece word's leading space is only kept inside a sequence)."""
    before = codec.decode(prompt)
    text = codec.decode(prompt + new)
    return text[len(before) :] if text.startswith(before) else codec.decode(new)


def has_tokenizer(location: Path) -> bool:
    """Whether load_codec finds a tokenizer at `location`."""
    names = (SENTENCEPIECE_FILE, *HF_TOKENIZER_FILES)
    return any((location / name).is_file() for name in names)


def load_codec(location: Path) -> TextCodec | None:
    """The tokenizer at `location` (a checkpoint's tokenizer/ or a HF directory); None when
    there is none (prompts must then be given as input_ids)."""
    if (location / SENTENCEPIECE_FILE).is_file():
        return SentencePieceCodec(location / SENTENCEPIECE_FILE)
    if any((location / f).is_file() for f in HF_TOKENIZER_FILES):
        return HFCodec(location)
    return None


def _jsonl_lines(path: Path) -> list[tuple[str, str | None, list[int] | None]]:
    """(where, text, ids) of each non-empty line of a JSONL file: a line holds "input_ids" (and
    perhaps "text") or "text"."""
    lines: list[tuple[str, str | None, list[int] | None]] = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(f"{where} is not JSON ({err.msg})") from None
        text = record.get("text") if isinstance(record, dict) else None
        ids = record.get("input_ids") if isinstance(record, dict) else None
        if not isinstance(ids, list) and not isinstance(text, str):
            raise ValueError(f'{where} has neither "text" nor "input_ids"')
        lines.append(
            (
                where,
                text if isinstance(text, str) else None,
                [int(i) for i in ids] if isinstance(ids, list) else None,
            )
        )
    return lines


def _existing(path: Path, key: str) -> Path:
    if not path.is_file():
        raise FileNotFoundError(f"{key}={path}: no such file")
    return path


def read_prompts(path: Path, codec: TextCodec | None) -> list[tuple[str, list[int]]]:
    """(text, ids) of each prompt in a file: JSONL lines with "text" or "input_ids" (a .jsonl
    file), else one text prompt per non-empty line."""
    _existing(path, "prompts")
    records: list[tuple[str, list[int]]] = []
    if path.suffix == ".jsonl":
        for where, text, ids in _jsonl_lines(path):
            if ids is None:
                records.append((text or "", encode(text or "", codec, where)))
            else:
                shown = codec.decode(ids) if codec is not None else ""
                records.append((text if text is not None else shown, ids))
    else:
        records = [
            (line, encode(line, codec, f"{path}:{number}"))
            for number, line in enumerate(path.read_text().splitlines(), 1)
            if line.strip()
        ]
    if not records:
        raise ValueError(f"prompts={path} holds no prompt")
    return records


def read_token_stream(path: Path, codec: TextCodec | None) -> list[int]:
    """A text file's tokens, or a JSONL file's: "text" lines joined by blank lines, or
    "input_ids" lines concatenated."""
    _existing(path, "data_file")
    if path.suffix != ".jsonl":
        return encode(path.read_text(), codec, str(path), "data_file")
    lines = _jsonl_lines(path)
    ids = [line[2] for line in lines]
    if all(i is not None for i in ids):
        return [token for i in ids for token in i or []]
    if any(i is not None for i in ids):
        raise ValueError(f'{path} mixes "text" and "input_ids" lines; use one kind')
    joined = "\n\n".join(text or "" for _, text, _ in lines)
    return encode(joined, codec, str(path), "data_file")


def encode(text: str, codec: TextCodec | None, where: str, key: str = "prompts") -> list[int]:
    """`text`'s ids; ValueError naming `key` (the option that gave it) without a tokenizer."""
    if codec is None:
        raise ValueError(
            f"{where}: text needs a tokenizer, and the model's directory has none (no "
            f"tokenizer/ in a tpformer checkpoint, no tokenizer files beside a Hugging Face "
            f'config.json); give {key} as a JSONL file with "input_ids" per line'
        )
    return codec.encode(text)
