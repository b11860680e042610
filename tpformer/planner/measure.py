"""What the planner's predictions are checked against: the peak bytes of activations autograd
keeps alive for backward during a real training step, under any schedule."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import Tensor


class _Saved:
    """A saved tensor's stand-in: counts its storage while autograd holds it."""

    __slots__ = ("key", "meter", "tensor")

    def __init__(self, tensor: Tensor, meter: PeakSavedActivations, key: int) -> None:
        self.tensor, self.meter, self.key = tensor, meter, key

    def __del__(self) -> None:
        self.meter._release(self.key)


class PeakSavedActivations:
    """`with meter.active(): <forwards and backwards>` -> meter.peak: the most bytes of saved
    activations alive at once (a storage counted once however many tensors view it;
    parameters and views of them are not activations)."""

    def __init__(self) -> None:
        self.live = self.peak = 0
        self._refs: dict[int, list[int]] = {}  # storage -> [references, bytes]

    def _release(self, key: int) -> None:
        entry = self._refs.get(key)
        if entry is None:
            return
        entry[0] -= 1
        if entry[0] == 0:
            self.live -= entry[1]
            del self._refs[key]

    def _pack(self, t: Tensor) -> object:
        base = t._base if t._base is not None else t
        if base.is_leaf and base.requires_grad:  # a parameter (or a view of one)
            return t
        storage = t.untyped_storage()
        key = storage.data_ptr()
        entry = self._refs.setdefault(key, [0, storage.nbytes()])
        if entry[0] == 0:
            self.live += entry[1]
            self.peak = max(self.peak, self.live)
        entry[0] += 1
        return _Saved(t, self, key)

    @staticmethod
    def _unpack(saved: object) -> Tensor:
        return saved.tensor if isinstance(saved, _Saved) else saved  # type: ignore[return-value]

    @contextmanager
    def active(self) -> Iterator[PeakSavedActivations]:
        with torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack):
            yield self
