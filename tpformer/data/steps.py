"""Each step's input, prepared on the host ahead of the step, in background workers.

A step's micro-batches are a pure function of (seed, step, layout) (data/loader.py), so they can
be built anywhere and early: `StepLoader` is a `torch.utils.data.DataLoader` over step numbers
whose workers (`data.num_workers`; 0 builds them in line) run `prepare_step` up to
`data.prefetch_steps` steps ahead, into pinned memory on accelerators. Besides the batches,
`prepare_step` computes on the host what the loss normalization needs (this rank's counts, the
step's mask width), so the training step never reads a device value to start; and it drops the
padding mask of a micro-batch that has no padding, so its attention runs without a mask (flash
on CUDA) — decided here, from the host tensor, with no device read.
"""

from __future__ import annotations

import atexit
import math
import multiprocessing
import signal
import sys
import time
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import Tensor
from torch.utils.data import DataLoader, Dataset

Batch = dict[str, Tensor]


class StepSource(Protocol):
    """This DP rank's micro-batches of each global step."""

    def __call__(self, step: int) -> list[tuple[int, Batch]]:
        """(dropout key, batch) per micro-batch; the key is the micro-batch's first position
        in the global sample order."""
        ...

    def mask_width(self, step: int) -> int:
        """The widest micro-batch (tokens) of `step` over *all* DP ranks, computed on the host
        (attention dropout is drawn at this width; see ParallelDropout)."""
        ...


class Counter(Protocol):
    """What the host prepares per micro-batch: an Objective's `counts` (what normalizes its
    loss) and `host_inputs` (index tensors the step would otherwise find on the device)."""

    def counts(self, batch: Batch) -> list[float]: ...

    def host_inputs(self, batch: Batch) -> Batch: ...


@dataclass
class StepInput:
    """One global step's input for this rank, ready before the step starts."""

    step: int
    parts: list[tuple[int, Batch]]
    """(dropout key, batch) per micro-batch, on the host."""
    counts: Tensor
    """float64 [objective counts..., tokens, real tokens] of this rank's micro-batches; the
    step sums it over DP on the device."""
    mask_width: int
    padded: bool = False
    """The source's batches carry padding masks (whether or not this step's needed them):
    the step reports its pad fraction."""

    def pin_memory(self) -> StepInput:
        """Called by the DataLoader's pinning thread on accelerators (non_blocking copies)."""
        parts = [(key, {k: v.pin_memory() for k, v in b.items()}) for key, b in self.parts]
        return StepInput(self.step, parts, self.counts.pin_memory(), self.mask_width, self.padded)

    def to(self, device: torch.device) -> StepInput:
        parts = [
            (key, {k: v.to(device, non_blocking=True) for k, v in b.items()})
            for key, b in self.parts
        ]
        counts = self.counts.to(device, non_blocking=True)
        return StepInput(self.step, parts, counts, self.mask_width, self.padded)


def prepare_step(source: StepSource, counter: Counter, step: int) -> StepInput:
    """The step's batches and, from their host tensors, its counts and mask width."""
    parts = [(key, counter.host_inputs(b)) for key, b in source(step)]
    per_batch = [counter.counts(b) for _, b in parts]
    local = [sum(c) for c in zip(*per_batch)]
    tokens = sum(b["input_ids"].numel() for _, b in parts)
    real = sum(
        int(b["attention_mask"].sum()) if "attention_mask" in b else b["input_ids"].numel()
        for _, b in parts
    )
    width = source.mask_width(step)
    widest = max((b["input_ids"].shape[-1] for _, b in parts), default=0)
    if widest > width:
        raise RuntimeError(
            f"step {step}: a micro-batch is {widest} tokens wide but the source says the step's "
            f"widest is {width} (StepSource.mask_width must cover every DP rank's batches)"
        )
    counts = torch.tensor([*local, float(tokens), float(real)], dtype=torch.float64)
    padded = any("attention_mask" in b for _, b in parts)
    return StepInput(step, [(key, unpadded(b)) for key, b in parts], counts, width, padded)


def unpadded(batch: Batch) -> Batch:
    """`batch` without its padding mask when every position is a token: the attention then
    takes no mask (flash, not the memory-efficient kernel, on CUDA) and computes the same."""
    mask = batch.get("attention_mask")
    if mask is None or not bool(mask.all()):
        return batch
    return {k: v for k, v in batch.items() if k != "attention_mask"}


class _Steps(Dataset[StepInput]):
    def __init__(self, source: StepSource, counter: Counter, first: int, stop: int) -> None:
        self.source, self.counter, self.first, self.stop = source, counter, first, stop

    def __len__(self) -> int:
        return self.stop - self.first

    def __getitem__(self, index: int) -> StepInput:
        return prepare_step(self.source, self.counter, self.first + index)


def _ignore_sigterm(worker_id: int) -> None:
    """Preemption signals the whole process group: the training process saves and then stops
    its workers itself (they also exit when it dies), so a worker must not die of SIGTERM first."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


def _worker_context() -> multiprocessing.context.BaseContext | None:
    """fork on Linux, whatever the process's default start method: workers start at once and
    inherit the dataset instead of pickling it (they never touch the accelerator)."""
    return multiprocessing.get_context("fork") if sys.platform == "linux" else None


def _as_is(item: Any) -> Any:
    """batch_size=None: each item is one whole step already."""
    return item


_OPEN: weakref.WeakSet[StepLoader] = weakref.WeakSet()
"""Loaders whose workers may be running (closed at interpreter exit, before multiprocessing's
own exit handler, which atexit runs later because it was registered first)."""


@atexit.register
def _close_open_loaders() -> None:
    for loader in list(_OPEN):
        loader.close()


class StepLoader:
    """Steps [first, stop) in order, prepared by `num_workers` processes `prefetch_steps`
    ahead; `wait_s` is how long the last `next` waited for its step. A worker's exception
    is raised here with its traceback, and a worker that dies ends the run (DataLoader's
    own checks), never a hang."""

    def __init__(
        self,
        source: StepSource,
        counter: Counter,
        *,
        first: int,
        stop: int,
        num_workers: int,
        prefetch_steps: int,
        pin_memory: bool,
    ) -> None:
        workers = min(num_workers, max(0, stop - first))
        self.loader = DataLoader(
            _Steps(source, counter, first, stop),
            batch_size=None,
            shuffle=False,
            num_workers=workers,
            collate_fn=_as_is,
            pin_memory=pin_memory,
            prefetch_factor=max(1, math.ceil(prefetch_steps / workers)) if workers else None,
            worker_init_fn=_ignore_sigterm if workers else None,
            multiprocessing_context=_worker_context() if workers else None,
        )
        self.wait_s = 0.0
        self._iter: Iterator[StepInput] | None = None

    def __iter__(self) -> StepLoader:
        self._iter = iter(self.loader)
        _OPEN.add(self)
        return self

    def __next__(self) -> StepInput:
        assert self._iter is not None, "iterate the loader first"
        start = time.perf_counter()
        try:
            item = next(self._iter)
        except BaseException:  # a worker's error, a dead worker or the end: workers stop now
            self.close()
            raise
        self.wait_s = time.perf_counter() - start
        return item

    def close(self) -> None:
        """Stop the workers now: the DataLoader sends them their sentinel and joins them. Every
        path out of the loop calls it, and so does interpreter exit for a loader left open: a
        worker ignores SIGTERM, so one left to multiprocessing's exit handler, which terminates
        and then joins, would be waited for forever."""
        iterator, self._iter = self._iter, None
        _OPEN.discard(self)
        shutdown = getattr(iterator, "_shutdown_workers", None)  # DataLoader's own shutdown
        if shutdown is not None:
            shutdown()
