"""What the planner's predictions are checked against: the bytes a training step's operators
allocate and hold (its activations, the engine's working buffers, the peak) and its FLOPs, on
any device (the meta device of a dry run, or a real step), under any schedule."""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import flop_registry


class StepMeter(TorchDispatchMode):
    """What the operators inside it allocate and compute.

    live     bytes of the storages they allocated that are still alive (a storage counts from
             the op that allocated it, an output that is no view of an input and not written
             into one, until it is freed)
    held     the most alive when a backward pass is called: what the forwards in flight keep
             for backward (the planner's activations)
    buffers  the most `working()` said: buffers the engine keeps out of the operators' sight
             (pooled gradient buckets, storages resized for a gather)
    peak     the most of live + working at once
    flops    by FlopCounterMode's formulas, without its module tracker, whose backward hooks
             keep every recomputed activation alive to the end of the step
    """

    def __init__(self, working: Callable[[], int] = lambda: 0) -> None:
        super().__init__()
        self.working = working
        self.buffers = 0
        self.live = 0
        self.peak = 0
        self.held = 0
        self.flops = 0
        self._seen: set[int] = set()
        self._backward = torch.autograd.backward

    def __enter__(self) -> StepMeter:
        # every backward (Tensor.backward too) goes through torch.autograd.backward; checkpoint's
        # recomputation inside it runs outside the graph task, so the engine's own state cannot
        # tell where a backward starts
        def backward(*args: Any, **kwargs: Any) -> None:
            self.held = max(self.held, self.live)
            self._sample()
            self._backward(*args, **kwargs)

        torch.autograd.backward = backward
        return super().__enter__()

    def __exit__(self, *exc: Any) -> None:
        torch.autograd.backward = self._backward
        super().__exit__(*exc)

    def _free(self, key: int, nbytes: int) -> None:
        self.live -= nbytes
        self._seen.discard(key)

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        formula = flop_registry.get(func._overloadpacket)
        if formula is not None:
            self.flops += formula(*args, **kwargs, out_val=out)
        outputs = out if isinstance(out, (tuple, list)) else (out,)
        for t, fresh in zip(outputs, _fresh_returns(func, len(outputs)), strict=True):
            if fresh and isinstance(t, torch.Tensor) and t.layout == torch.strided:
                self._allocated(t.untyped_storage())
        return out

    def _allocated(self, storage: torch.UntypedStorage) -> None:
        key = id(storage)
        if key not in self._seen:
            self._seen.add(key)
            self.live += storage.nbytes()
            weakref.finalize(storage, self._free, key, storage.nbytes())
            self._sample()

    def _sample(self) -> None:
        working = self.working()
        self.buffers = max(self.buffers, working)
        self.peak = max(self.peak, self.live + working)


def _fresh_returns(func: Any, count: int) -> list[bool]:
    """Which of an operator's `count` outputs are new storages: those its schema does not
    alias to an input (views, in-place and out= results do). c10d's collectives write into
    tensors they are given, though their schemas do not say so."""
    if func.namespace == "c10d":
        return [False] * count
    returns = func._schema.returns
    if len(returns) == 1 and count != 1:  # one Tensor[] return
        return [returns[0].alias_info is None] * count
    return [r.alias_info is None for r in returns][:count] + [False] * (count - len(returns))
