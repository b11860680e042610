"""A training step queues its work without reading a device value on the host.

Every way a tensor reaches the host (item, tolist, cpu, numpy, bool/int/float) is patched to
count its calls while a step is queued (Trainer.queue_step, ZeroEngine.queue_step): the count
must be 0 there. Reads happen only at log lines (one per `trainer.log_every` steps) and in
evaluation. The per-step stop agreement (SIGTERM, time limit) reads a host tensor reduced over
the gloo control group, never a device value: checked by its group's backend. The data are
prepared by StepLoader before each step; with num_workers=0 that happens in this process,
outside the counted calls (it reads host tensors only).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from tests.dist import run_distributed
from tests.planner.test_memory_prediction import base_config
from tpformer.config.schema import Config, DataConfig, ParallelConfig
from tpformer.engine.engine import ZeroEngine
from tpformer.parallel.context import ParallelContext
from tpformer.train.loop import Trainer
from tpformer.train.pretraining import pretraining_trainer

READS = ("item", "tolist", "cpu", "numpy", "__bool__", "__int__", "__float__", "__index__")
STEPS, LOG_EVERY = 6, 3


@contextmanager
def counted_reads(counts: Counter[str]) -> Iterator[Callable[[Callable[..., Any]], Any]]:
    """Patch every host read of a tensor to count while `inside` is active; yields a wrapper
    that makes a function an `inside` region."""
    depth = [0]
    originals = {name: getattr(torch.Tensor, name) for name in READS}

    def counting(name: str) -> Callable[..., Any]:
        original = originals[name]

        def read(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
            if depth[0]:
                counts[name] += 1
            return original(self, *args, **kwargs)

        return read

    def inside(fn: Callable[..., Any]) -> Callable[..., Any]:
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            depth[0] += 1
            try:
                return fn(*args, **kwargs)
            finally:
                depth[0] -= 1

        return wrapped

    for name in READS:
        setattr(torch.Tensor, name, counting(name))
    try:
        yield inside
    finally:
        for name, original in originals.items():
            setattr(torch.Tensor, name, original)


def _config(parallel: ParallelConfig) -> Config:
    config = base_config()
    return replace(
        config,
        parallel=parallel,
        data=DataConfig(source="synthetic", seq_length=64, num_workers=0),
        trainer=replace(
            config.trainer, max_steps=STEPS, log_every=LOG_EVERY, grad_accum=2, micro_batch_size=2
        ),
    )


def _count(ctx: ParallelContext, parallel: ParallelConfig, run_dir: str) -> dict[str, Any]:
    counts: Counter[str] = Counter()
    trainer = pretraining_trainer(_config(parallel), ctx, Path(run_dir) / f"rank{ctx.rank}")
    with counted_reads(counts) as inside:
        patched = {
            (Trainer, "queue_step"): inside(Trainer.queue_step),
            (ZeroEngine, "queue_step"): inside(ZeroEngine.queue_step),
        }
        originals = {key: getattr(*key) for key in patched}
        for (owner, name), fn in patched.items():
            setattr(owner, name, fn)
        try:
            records = trainer.train()
        finally:
            for (owner, name), fn in originals.items():
                setattr(owner, name, fn)
    control = dist.get_backend(ctx.control.group) if ctx.control.group is not None else "gloo"
    return {"reads": dict(counts), "logged": [r["step"] for r in records], "control": control}


def test_a_step_reads_nothing_from_the_device_single_process(tmp_path: Path) -> None:
    result = _count(ParallelContext.single(device="cpu"), ParallelConfig(), str(tmp_path))
    assert result["logged"] == [1, 3, 6]  # the loop did train, and logged where expected
    assert result["reads"] == {}


def test_a_step_reads_nothing_from_the_device_tp2_dp2(tmp_path: Path) -> None:
    """Four ranks: the DP sums of counts and totals, the TP collectives, ZeRO-1's gathers."""
    results = run_distributed(
        _count,
        4,
        ParallelConfig(tensor=2, data=2, zero_stage=1),
        str(tmp_path),
        tensor=2,
        data=2,
    )
    for rank, result in enumerate(results):
        assert result["logged"] == [1, 3, 6], result
        assert result["reads"] == {}, f"rank {rank}: {result['reads']}"
        assert result["control"] == "gloo"
