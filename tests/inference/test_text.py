"""The prompt and text files the inference commands read: text lines, JSONL with text or ids,
and what is refused, each naming the file and line."""

from __future__ import annotations

from pathlib import Path

import pytest

from tpformer.inference.text import continuation, read_prompts, read_token_stream


class Letters:
    """A codec of one id per character (a-z -> 0-25, space 26)."""

    def encode(self, text: str) -> list[int]:
        return [26 if c == " " else ord(c) - 97 for c in text]

    def decode(self, ids: list[int]) -> str:
        return "".join(" " if i == 26 else chr(i + 97) for i in ids)


def test_prompt_files(tmp_path: Path) -> None:
    lines = tmp_path / "p.txt"
    lines.write_text("ab\n\nc d\n")
    assert read_prompts(lines, Letters()) == [("ab", [0, 1]), ("c d", [2, 26, 3])]
    jsonl = tmp_path / "p.jsonl"
    jsonl.write_text('{"text": "ba"}\n{"input_ids": [2, 0]}\n{"text": "x", "input_ids": [1]}\n')
    assert read_prompts(jsonl, Letters()) == [("ba", [1, 0]), ("ca", [2, 0]), ("x", [1])]
    ids_only = tmp_path / "ids.jsonl"
    ids_only.write_text('{"input_ids": [4, 5]}\n')
    assert read_prompts(ids_only, None) == [("", [4, 5])]


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("p.jsonl", '{"text": "a"}\nnot json\n', r"p.jsonl:2 is not JSON"),
        ("p.jsonl", '{"prompt": "a"}\n', r'p.jsonl:1 has neither "text" nor "input_ids"'),
        ("p.txt", "\n\n", r"holds no prompt"),
        ("q.txt", "a text\n", r"q.txt:1: text needs a tokenizer"),
    ],
)
def test_bad_prompt_files_name_the_line(
    tmp_path: Path, name: str, content: str, message: str
) -> None:
    (tmp_path / name).write_text(content)
    codec = None if name == "q.txt" else Letters()
    with pytest.raises(ValueError, match=message):
        read_prompts(tmp_path / name, codec)
    with pytest.raises(FileNotFoundError, match=r"prompts=.*missing.txt: no such file"):
        read_prompts(tmp_path / "missing.txt", codec)


def test_token_streams(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("ab c")
    assert read_token_stream(tmp_path / "a.txt", Letters()) == [0, 1, 26, 2]
    (tmp_path / "t.jsonl").write_text('{"text": "a"}\n{"text": "b"}\n')
    with pytest.raises(ValueError, match="text needs a tokenizer"):
        read_token_stream(tmp_path / "t.jsonl", None)
    (tmp_path / "i.jsonl").write_text('{"input_ids": [1, 2]}\n{"input_ids": [3]}\n')
    assert read_token_stream(tmp_path / "i.jsonl", None) == [1, 2, 3]
    (tmp_path / "m.jsonl").write_text('{"input_ids": [1]}\n{"text": "b"}\n')
    with pytest.raises(ValueError, match='mixes "text" and "input_ids"'):
        read_token_stream(tmp_path / "m.jsonl", Letters())


def test_continuation_is_the_text_after_the_prompt() -> None:
    assert continuation(Letters(), [0, 26], [1, 2]) == "bc"
