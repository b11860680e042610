"""Checkpoints written while training goes on (trainer.async_save).

A save first stages the state: a copy in host memory (pinned on accelerators, so the copy is
queued on the stream) made in the training thread, so the next optimizer step cannot change
what is written; it holds a second host copy of the state until the write is done. A background
thread then runs `store.save` on the copy -- DCP's write, the checksums, meta.json and the
atomic rename, as a synchronous save does -- over a gloo group of its own, so its collectives
never interleave with the training thread's. One save is in flight at a time: the next save,
the end of the run and a stop wait for it, and a failed write is raised then (or at the next
step, through the loop's stop agreement) on every rank, naming the directory.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from torch.distributed.tensor import DTensor

from tpformer.checkpoint import store
from tpformer.parallel.comm import ProcessGroup
from tpformer.parallel.context import ParallelContext


def _host_copy(t: Tensor) -> Tensor:
    """A copy in host memory: pinned, and queued without waiting, from an accelerator."""
    t = t.detach()
    if t.device.type == "cpu":
        return t.clone()
    out = torch.empty(t.shape, dtype=t.dtype, device="cpu", pin_memory=True)
    return out.copy_(t, non_blocking=True)


def _stage(value: Any) -> Any:
    """The state with every tensor copied to host memory (DTensors keep their placement, so
    DCP still reshards them on load); other values as they are."""
    if isinstance(value, dict):
        return {k: _stage(v) for k, v in value.items()}
    if isinstance(value, DTensor):
        return DTensor.from_local(
            _host_copy(value.to_local()),
            value.device_mesh,
            value.placements,
            run_check=False,
            shape=value.shape,
            stride=value.stride(),
        )
    if isinstance(value, Tensor):
        return _host_copy(value)
    return value


class CheckpointWriter:
    """`save` returns once the state is staged (async) or written (sync); `wait` blocks until
    the save in flight is complete and raises its error."""

    def __init__(self, ctx: ParallelContext, *, background: bool) -> None:
        self.ctx, self.background = ctx, background
        self.group: ProcessGroup | None = None
        if background:  # every rank creates it, in the same order
            self.group = ctx.host_group()
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="checkpoint")
        self.pending: Future[Path] | None = None

    def save(
        self,
        root: Path,
        step: int,
        state: dict[str, Any],
        *,
        meta: dict[str, Any],
        keep_last: int,
        tokenizer_files: Sequence[Path] = (),
    ) -> Path:
        """Write `state` (plain tensors and dicts: call state_dict() first) as store.save."""
        self.wait()
        if not self.background:
            return store.save(
                root,
                step,
                state,
                self.ctx,
                meta=meta,
                keep_last=keep_last,
                tokenizer_files=tokenizer_files,
            )
        staged = _stage(state)
        copied = torch.cuda.Event() if torch.cuda.is_available() else None
        if copied is not None:
            copied.record()  # the copies are queued before any later step changes the state

        def write() -> Path:
            if copied is not None:
                copied.synchronize()  # the background thread waits, not training
            return store.save(
                root,
                step,
                staged,
                self.ctx,
                meta=meta,
                keep_last=keep_last,
                tokenizer_files=tokenizer_files,
                group=self.group,
            )

        self.pending = self.executor.submit(write)
        return root / store.step_dir_name(step)

    def failed(self) -> bool:
        """The save in flight has ended with an error (host-only; never waits)."""
        return (
            self.pending is not None
            and self.pending.done()
            and self.pending.exception() is not None
        )

    def wait(self) -> None:
        """Until the save in flight is complete; its error (OSError naming the directory) is
        raised here."""
        pending, self.pending = self.pending, None
        if pending is not None:
            pending.result()

    def close(self) -> None:
        """Wait for the save in flight, then stop the thread (the end of a run)."""
        try:
            self.wait()
        finally:
            self.executor.shutdown(wait=True)
