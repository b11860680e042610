"""Reads the records of an offline W&B run file (run-<id>.wandb), so tests can check what a run
logged without a network or a W&B server: the file is W&B's LevelDB-style log of protobuf
`Record`s (7-byte file header, 32 KiB blocks, a crc/length/type header per chunk)."""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

BLOCK = 32 * 1024
HEADER = 7
FULL, LAST = 1, 4


def records(path: Path) -> Iterator[Any]:
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a W&B run file"
    pos, pending = HEADER, b""
    while pos + HEADER <= len(data):
        left = BLOCK - pos % BLOCK
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + HEADER])
        if left < HEADER or (length == 0 and kind == 0):  # block trailer or padding
            pos += left
            continue
        pending += data[pos + HEADER : pos + HEADER + length]
        pos += HEADER + length
        if kind in (FULL, LAST):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            pending = b""
            yield record


def history_and_config(path: Path) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The logged rows (key -> value, W&B's own _step/_runtime/_timestamp dropped) and the
    run's config."""

    def key(item: Any) -> str:
        return item.key or "/".join(item.nested_key)

    rows, config = [], {}
    for record in records(path):
        kind = record.WhichOneof("record_type")
        if kind == "history":
            row = {key(i): json.loads(i.value_json) for i in record.history.item}
            rows.append({k: v for k, v in row.items() if not k.startswith("_")})
        elif kind == "run":
            config.update({key(u): json.loads(u.value_json) for u in record.run.config.update})
        elif kind == "config":
            config.update({key(u): json.loads(u.value_json) for u in record.config.update})
    return rows, config
