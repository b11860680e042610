"""A training step that cannot read the device: it runs with the model, the batches and every
state tensor on PyTorch's `meta` device (shapes and dtypes, no storage), on the `fake` process
group backend (each collective completes at once), for one rank of the layout. Any operation
that needs a device value on the host -- `item`, `tolist`, `bool(t)`, `nonzero`, a boolean
index, coalescing a sparse gradient, a CPU tensor mixed into the step -- raises there, so a
device sync added to the step later fails this test (the Python-level counter of
test_host_syncs.py cannot see `nonzero`). The step runs under `parallel.rng=fast`, the mode
accelerators run by default, and takes the generic collective paths (`gloo_shortcuts=False`),
as NCCL does. Two steps each: forward, backward, the DP/TP/pipeline communication and the
optimizer update, through the real Trainer.queue_step and the engine's queue_step.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch.testing._internal.distributed.fake_pg import FakeStore

from tests.train.test_finetune import _rte_config
from tests.train.test_host_syncs import _config
from tpformer.config.presets import preset
from tpformer.config.schema import Config, ParallelConfig
from tpformer.data.steps import prepare_step
from tpformer.parallel.context import ParallelContext
from tpformer.train.finetuning import finetuning_trainer
from tpformer.train.loop import Trainer
from tpformer.train.pretraining import pretraining_trainer

META = torch.device("meta")
LAYOUTS = {  # name: (world size, ParallelContext.create keys, parallel config keys)
    "tp2": (2, {"tensor": 2}, {"tensor": 2}),
    "tp2_sp": (
        2,
        {"tensor": 2, "sequence_parallel": True},
        {"tensor": 2, "sequence_parallel": True},
    ),
    "zero3_dp2": (2, {"data": 2}, {"data": 2, "zero_stage": 3}),
    "pipeline2": (2, {"pipeline": 2}, {"pipeline": 2}),
}


SIZES = ("vocab_size", "hidden_size", "num_heads", "num_layers", "intermediate_size")


def _gpt(config: Config) -> Config:
    """The same run with a GPT of the BERT test model's sizes."""
    sizes = {k: getattr(config.model, k) for k in (*SIZES, "max_position_embeddings")}
    return replace(config, model=preset("gpt2_small", **sizes))


def _meta_steps(world: int, layout: dict, build: Callable[[ParallelContext], Trainer]) -> dict:
    """Two steps of rank 0 of `world` on meta; returns what the step left on the device."""
    dist.init_process_group("fake", rank=0, world_size=world, store=FakeStore())
    try:
        ctx = ParallelContext.create(device=META, rng="fast", gloo_shortcuts=False, **layout)
        trainer = build(ctx)
        assert next(trainer.model.parameters()).device == META
        for step in range(2):
            prepared = prepare_step(trainer.task.train_batches, trainer.task.objective, step)
            result = trainer.queue_step(prepared, train=True)
            status = trainer.runner.update()
        return {"values": result.values, **status}
    finally:
        dist.destroy_process_group()


def _check(out: dict) -> None:
    assert out["values"].device == META
    assert out["grad_norm"].device == META and out["skipped"].device == META


@pytest.mark.parametrize("arch", ["bert", "gpt"])
@pytest.mark.parametrize("name", list(LAYOUTS))
def test_a_pretraining_step_runs_where_no_device_value_can_be_read(
    tmp_path: Path, arch: str, name: str
) -> None:
    world, layout, keys = LAYOUTS[name]
    config = _config(ParallelConfig(rng="fast", gloo_shortcuts=False, **keys))  # type: ignore[arg-type]
    config = _gpt(config) if arch == "gpt" else config
    _check(_meta_steps(world, layout, lambda ctx: pretraining_trainer(config, ctx, tmp_path)))


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_a_finetuning_step_runs_where_no_device_value_can_be_read(
    tmp_path: Path, name: str
) -> None:
    world, layout, keys = LAYOUTS[name]
    config = _rte_config(tmp_path, rng="fast", gloo_shortcuts=False, **keys)
    if keys.get("pipeline"):
        config = replace(config, trainer=replace(config.trainer, micro_batch_size=4))
    _check(
        _meta_steps(world, layout, lambda ctx: finetuning_trainer(config, ctx, tmp_path / "run"))
    )


def test_a_device_read_in_the_step_fails_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The check can fail: a step that finds the labeled rows with nonzero, as the MLM head did
    before its positions came with the batch, raises on meta."""
    from tpformer.layers import sequence

    original = sequence.SequenceRows.rows_at

    def nonzero_positions(self, hidden, positions, seq_len):  # type: ignore[no-untyped-def]
        labeled = (positions >= 0).reshape(-1).nonzero()  # data-dependent: a device sync
        return original(self, hidden, positions, seq_len)[0], labeled

    monkeypatch.setattr(sequence.SequenceRows, "rows_at", nonzero_positions)
    world, layout, keys = LAYOUTS["tp2"]
    config = _config(ParallelConfig(rng="fast", gloo_shortcuts=False, **keys))  # type: ignore[arg-type]
    with pytest.raises(NotImplementedError, match="nonzero"):
        _meta_steps(world, layout, lambda ctx: pretraining_trainer(config, ctx, tmp_path))
