"""GLUE rows -> token ids: [CLS] a [SEP] (b [SEP]), the longer segment truncated first, cached by
file content, tokenizer and max_length; and the collation of examples into padded batches."""

from __future__ import annotations

import hashlib
from pathlib import Path

import torch

from tpformer.config.schema import GlueDataConfig
from tpformer.data.glue.own import dataset_rows, dataset_splits
from tpformer.data.glue.tasks import GlueTask, load_split
from tpformer.data.tokenizer import Tokenizer

FEATURES_VERSION = 2
"""Part of the cache key: 2 = transformers' longest_first truncation (ties trim segment b)."""


def encode(tokenizer: Tokenizer, rows: dict[str, list], max_length: int) -> list[dict[str, list]]:
    """[CLS] a [SEP] (b [SEP]) per row, truncated as transformers' `longest_first`: one token at
    a time from the end of the longer segment, from b when both are as long."""
    a = tokenizer.encode(rows["text_a"])
    b = tokenizer.encode(rows["text_b"]) if rows["text_b"] is not None else [None] * len(a)
    examples = []
    for i, (x, y) in enumerate(zip(a, b)):
        room = max_length - (3 if y is not None else 2)
        x, y = list(x), list(y) if y is not None else None
        while len(x) + (len(y) if y is not None else 0) > room:
            if y is None or len(x) > len(y):
                x.pop()
            else:
                y.pop()
        ids = [tokenizer.cls_id, *x, tokenizer.sep_id]
        types = [0] * len(ids)
        if y is not None:
            ids += [*y, tokenizer.sep_id]
            types += [1] * (len(y) + 1)
        example = {"input_ids": ids, "token_type_ids": types, "index": rows["index"][i]}
        if "label" in rows:
            example["label"] = rows["label"][i]
        examples.append(example)
    return examples


def collate(
    examples: list[dict], pad_id: int, float_labels: bool, multiple: int = 1
) -> dict[str, torch.Tensor]:
    """Pad to the longest row of this micro-batch (rounded up to `multiple`), not to max_length.
    Labels: class ids, or floats (regression scores, multi-hot rows)."""
    width = max(len(e["input_ids"]) for e in examples)
    width += -width % multiple
    ids = torch.full((len(examples), width), pad_id, dtype=torch.long)
    types = torch.zeros_like(ids)
    mask = torch.zeros_like(ids)
    for row, e in enumerate(examples):
        n = len(e["input_ids"])
        ids[row, :n] = torch.tensor(e["input_ids"])
        types[row, :n] = torch.tensor(e["token_type_ids"])
        mask[row, :n] = 1
    batch = {"input_ids": ids, "token_type_ids": types, "attention_mask": mask}
    if "label" in examples[0]:
        batch["labels"] = torch.tensor(
            [e["label"] for e in examples], dtype=torch.float if float_labels else torch.long
        )
    return batch


def split_files(data: GlueDataConfig) -> dict[str, str]:
    return {"train": data.train_file, "dev": data.dev_file, "test": data.test_file}


def dev_splits(task: GlueTask, data: GlueDataConfig) -> tuple[str, ...]:
    """The dev splits evaluated: MNLI has two, unless one dev file is given."""
    return task.dev_splits[:1] if data.dev_file else task.dev_splits


def test_splits(task: GlueTask, data: GlueDataConfig) -> list[str]:
    """The test splits predicted: those present in glue_dir (or the given test file, or the
    dataset's test split)."""
    if data.dataset:
        return ["test"] if "test" in dataset_splits(data) else []
    if data.test_file:
        return list(task.test_splits[:1])
    if data.train_file or data.dev_file:
        return []
    if not data.glue_dir:
        return list(task.test_splits)
    folder = Path(data.glue_dir).expanduser() / task.directory
    return [s for s in task.test_splits if (folder / f"{s}.tsv").is_file()]


def load_examples(
    task: GlueTask, data: GlueDataConfig, split: str, tokenizer: Tokenizer, *, rank: int
) -> list[dict]:
    """Tokenized rows of a split, cached by file content, the task (its columns and labels),
    tokenizer and max_length."""
    key = hashlib.sha256(
        repr(
            (
                FEATURES_VERSION,
                task,
                split,
                data.glue_dir,
                data.max_length,
                tokenizer.fingerprint(),
            )
        ).encode()
    )
    kind = "train" if split == "train" else "test" if split.startswith("test") else "dev"
    rows = None
    if data.dataset:  # the user's task on a Hugging Face dataset: keyed by its fingerprint
        rows, fingerprint = dataset_rows(data, task, kind)
        key.update(f"{data.dataset} {data.dataset_config} {fingerprint}".encode())
    files = split_files(data)
    source = (
        Path(files[kind])
        if files[kind]
        else Path(data.glue_dir).expanduser() / task.directory / f"{split}.tsv"
    )
    if rows is None and source.is_file():  # a missing file fails in load_split, by name
        key.update(source.read_bytes())
    cache = (
        Path(data.cache_dir).expanduser()
        / "glue"
        / f"{task.name}-{split}-{key.hexdigest()[:16]}.pt"
    )
    if cache.is_file():
        return torch.load(cache)
    if rows is None:
        rows = load_split(data.glue_dir, task, split, files)
    examples = encode(tokenizer, rows, data.max_length)
    cache.parent.mkdir(parents=True, exist_ok=True)
    tmp = cache.with_suffix(f".tmp{rank}")
    torch.save(examples, tmp)
    tmp.replace(cache)
    return examples
