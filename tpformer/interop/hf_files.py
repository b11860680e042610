"""The files of a Hugging Face `save_pretrained` directory: its config.json, and its tensors
read by slice (safetensors, one file or a sharded index, or an mmap'ed pytorch_model.bin), so
no rank materializes the whole checkpoint."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import Tensor


def read_hf_config(directory: str | Path) -> dict:
    directory = Path(directory)
    if not directory.is_dir():
        raise FileNotFoundError(f"{directory} is not a directory; pass a save_pretrained directory")
    path = directory / "config.json"
    if not path.exists():
        raise FileNotFoundError(f"{directory} has no config.json; pass a save_pretrained directory")
    return json.loads(path.read_text())


class CheckpointFiles:
    """Tensors of a HF directory, read by slice: safetensors (single or sharded) or .bin."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._files: dict[str, str] = {}
        self._handles: dict[str, object] = {}
        index = directory / "model.safetensors.index.json"
        if index.exists():
            self._files = dict(json.loads(index.read_text())["weight_map"])
        elif (directory / "model.safetensors").exists():
            from safetensors import safe_open

            with safe_open(directory / "model.safetensors", "pt") as f:
                self._files = dict.fromkeys(f.keys(), "model.safetensors")
        elif (directory / "pytorch_model.bin").exists():
            self._bin = torch.load(
                directory / "pytorch_model.bin", map_location="cpu", mmap=True, weights_only=True
            )
            self._files = dict.fromkeys(self._bin, "pytorch_model.bin")
        else:
            present = sorted(p.name for p in directory.iterdir())
            raise FileNotFoundError(
                f"{directory} has no model.safetensors, model.safetensors.index.json or "
                f"pytorch_model.bin (it contains {present}); pass a save_pretrained directory"
            )

    def keys(self) -> list[str]:
        return list(self._files)

    def read(
        self, name: str, dim: int | None = None, start: int = 0, stop: int | None = None
    ) -> Tensor:
        """The stored tensor `name`, or its [start, stop) slice along `dim`."""
        file = self._files[name]
        if file == "pytorch_model.bin":
            t = self._bin[name]
            if dim is None:
                return t.clone()
            assert stop is not None, "a slice along `dim` needs its stop"
            return t.narrow(dim, start, stop - start).clone()
        if file not in self._handles:
            from safetensors import safe_open

            self._handles[file] = safe_open(self.directory / file, "pt")
        sliced = self._handles[file].get_slice(name)  # type: ignore[attr-defined]
        if dim is None:
            return sliced[:]
        index = [slice(None)] * len(sliced.get_shape())
        index[dim] = slice(start, stop)
        return sliced[tuple(index)]

    def shape(self, name: str) -> list[int]:
        if self._files[name] == "pytorch_model.bin":
            return list(self._bin[name].shape)
        self.read(name, 0, 0, 0)  # opens the handle
        return list(self._handles[self._files[name]].get_slice(name).get_shape())  # type: ignore[attr-defined]
