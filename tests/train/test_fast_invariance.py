"""parallel.rng=fast is exact within its key: for a fixed TP degree, CP degree and micro-batch size,
every other layout choice gives the losses of the run with only that TP and CP, dropout on, to
fp32 tolerance (FP32_MODEL_REL, as the exact-mode layout tests).

Why: fast masks depend only on (seed, step, sample, site, TP rank, CP rank). The hidden
dropouts are hashes of the global sample and position (tpformer/parallel/random.py), the same in
every layout; the attention dropout is SDPA's own draw from a stream keyed by (step, first sample
of the micro-batch, site, TP rank, CP rank), so the micro-batch size is part of its key and is
held fixed here (2 samples; global batch 8). Data parallelism with ZeRO 0-3 and offload, the
pipeline schedules, recomputation, accumulation, trainer.compile, loader workers, sequence
parallelism, stop-and-resume and a resume on a smaller world change none of those keys.

The reference of each row is a real run: one process (TP=1), or the TP=2 / CP=2 run alone.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.dist import run_distributed
from tests.pipeline.test_pipeline_training import pipeline_config
from tests.tolerances import FP32_MODEL_REL
from tests.train.test_finetune import _predictions, _rte_config
from tpformer.config.schema import Config
from tpformer.parallel.context import ParallelContext
from tpformer.train.pretraining import pretraining_trainer

STEPS, MICRO, GLOBAL = 4, 2, 8
EXIT = 2
"""A stopped run exits after this step; its resume runs the rest."""
LAYOUT_KEYS = ("tensor", "data", "pipeline", "context", "sequence_parallel")


def _config(arch: str, world: int, parallel: dict, trainer: dict) -> Config:
    """The arch's 4-layer model, dropout 0.1, micro-batch 2, global batch 8 over the DP ranks."""
    tp, pp, cp = (parallel.get(k, 1) for k in ("tensor", "pipeline", "context"))
    dp = world // (tp * pp * cp)
    config = pipeline_config(arch, steps=STEPS, micro=MICRO, accum=GLOBAL // (MICRO * dp))
    config = replace(config, parallel=replace(config.parallel, rng="fast", **parallel))
    if trainer:
        config = replace(config, trainer=replace(config.trainer, **trainer))
    return config


def _losses(ctx: ParallelContext, config: Config, run_dir: str, **trainer: Any) -> list[float]:
    if trainer:
        config = replace(config, trainer=replace(config.trainer, **trainer))
    return [r["loss"] for r in pretraining_trainer(config, ctx, Path(run_dir)).train()]


def _stop_then_resume(ctx: ParallelContext, config: Config, run_dir: str) -> list[float]:
    """Stop after step EXIT, resume to the end: the losses of both parts."""
    first = _losses(ctx, config, run_dir, exit_at_step=EXIT)
    return first + _losses(ctx, config, run_dir, resume="auto")


def _launch(fn: Any, arch: str, world: int, parallel: dict, trainer: dict, *args: Any) -> list:
    """fn(ctx, config, *args) on `world` ranks under fast mode; every rank's result."""
    config = _config(arch, world, parallel, trainer)
    layout = {k: v for k, v in parallel.items() if k in LAYOUT_KEYS}
    if world == 1:
        return [fn(ParallelContext.single(device="cpu", rng="fast"), config, *args)]
    return run_distributed(fn, world, config, *args, rng="fast", **layout)


REFERENCES = {  # name: (arch, world, parallel keys): only the TP and CP degrees
    "bert": ("bert", 1, {}),
    "bert_tp2": ("bert", 2, {"tensor": 2}),
    "bert_cp2": ("bert", 2, {"context": 2}),
    "gpt": ("gpt", 1, {}),
    "llama": ("llama", 1, {}),  # no dropout: its TP=2 rows take the one-process reference
    "modernbert": ("modernbert", 1, {}),  # dropout 0.1 (tests/pipeline's config)
}

DP2 = {"data": 2}
PP2 = {"pipeline": 2}
FULL = {"recompute": "full"}
COMPILE = {"compile": True}
ROWS = [  # (row, reference, world, parallel keys, trainer keys, slow)
    ("dp2", "bert", 2, DP2, {}, False),
    ("dp2_zero1", "bert", 2, {**DP2, "zero_stage": 1}, {}, False),
    ("dp2_zero2", "bert", 2, {**DP2, "zero_stage": 2}, {}, False),
    ("dp2_zero3", "bert", 2, {**DP2, "zero_stage": 3}, {}, False),
    (
        "dp2_zero2_offload",
        "bert",
        2,
        {**DP2, "zero_stage": 2, "cpu_offload": "optimizer"},
        {},
        True,
    ),
    (
        "dp2_zero3_offload",
        "bert",
        2,
        {**DP2, "zero_stage": 3, "cpu_offload": "optimizer+params"},
        {},
        True,
    ),
    ("pp2_gpipe", "bert", 2, {**PP2, "pipeline_schedule": "gpipe"}, {}, False),
    ("pp2_1f1b", "bert", 2, {**PP2, "pipeline_schedule": "1f1b"}, {}, False),
    ("pp2_interleaved", "bert", 2, {**PP2, "pipeline_schedule": "interleaved_1f1b"}, {}, True),
    ("recompute_selective", "bert", 1, {"recompute": "selective"}, {}, False),
    ("recompute_full", "bert", 1, FULL, {}, False),
    ("compile", "bert", 1, {}, COMPILE, True),
    ("compile_recompute_full", "bert", 1, FULL, COMPILE, True),
    ("tp2_sp", "bert_tp2", 2, {"tensor": 2, "sequence_parallel": True}, {}, False),
    ("tp2_dp2_zero3", "bert_tp2", 4, {"tensor": 2, **DP2, "zero_stage": 3}, {}, True),
    ("tp2_pp2", "bert_tp2", 4, {"tensor": 2, **PP2}, {}, True),
    ("cp2_pp2", "bert_cp2", 4, {"context": 2, **PP2}, {}, True),
    ("cp2_dp2", "bert_cp2", 4, {"context": 2, **DP2}, {}, True),
    ("gpt_dp2_zero3", "gpt", 2, {**DP2, "zero_stage": 3}, {}, False),
    ("gpt_pp2_1f1b", "gpt", 2, PP2, {}, False),
    ("gpt_recompute_full", "gpt", 1, FULL, {}, False),
    ("llama_dp2_zero3", "llama", 2, {**DP2, "zero_stage": 3}, {}, False),
    ("llama_tp2_sp", "llama", 2, {"tensor": 2, "sequence_parallel": True}, {}, False),
    ("llama_recompute_full", "llama", 1, FULL, {}, False),
    ("llama_compile", "llama", 1, {}, COMPILE, True),
    ("modernbert_dp2_zero3", "modernbert", 2, {**DP2, "zero_stage": 3}, {}, False),
    ("modernbert_pp2_1f1b", "modernbert", 2, PP2, {}, False),
    ("modernbert_recompute_full", "modernbert", 1, FULL, {}, False),
    ("modernbert_compile", "modernbert", 1, {}, COMPILE, True),
]


@pytest.fixture(scope="module")
def references(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[float]]:
    """Each reference's losses, computed once (lazily: a deselected reference costs nothing)."""
    cache: dict[str, list[float]] = {}

    class Lazy(dict):
        def __missing__(self, name: str) -> list[float]:
            arch, world, parallel = REFERENCES[name]
            run = str(tmp_path_factory.mktemp(name))
            cache[name] = _launch(_losses, arch, world, parallel, {}, run)[0]
            self[name] = cache[name]
            return cache[name]

    return Lazy()


def _assert_same(got: list[float], want: list[float], what: str) -> None:
    assert len(got) == len(want) == STEPS, (what, got, want)
    worst = max(abs(g - w) / abs(w) for g, w in zip(got, want, strict=True))
    print(f"fast invariance: {what}: max relative loss difference {worst:.1e}")  # -s shows it
    for step, (g, w) in enumerate(zip(got, want, strict=True), start=1):
        assert abs(g - w) <= FP32_MODEL_REL * abs(w), f"{what} step {step}: {got} vs {want}"


@pytest.mark.sweep
@pytest.mark.parametrize(
    ("row", "reference", "world", "parallel", "trainer"),
    [pytest.param(*row[:5], id=row[0], marks=[pytest.mark.slow] if row[5] else []) for row in ROWS],
)
def test_fast_mode_layout_gives_the_losses_of_its_tp_cp_reference(
    tmp_path: Path,
    references: dict[str, list[float]],
    row: str,
    reference: str,
    world: int,
    parallel: dict,
    trainer: dict,
) -> None:
    arch = REFERENCES[reference][0]
    want = references[reference]
    for rank, got in enumerate(_launch(_losses, arch, world, parallel, trainer, str(tmp_path))):
        _assert_same(got, want, f"{row} rank {rank}")


def test_fast_mode_loader_workers_give_the_same_losses(
    tmp_path: Path, references: dict[str, list[float]]
) -> None:
    """data.num_workers=2 prepares the steps (and the MLM head's labeled positions) in worker
    processes."""
    config = _config("bert", 1, {}, {})
    config = replace(config, data=replace(config.data, num_workers=2))
    ctx = ParallelContext.single(device="cpu", rng="fast")
    _assert_same(_losses(ctx, config, str(tmp_path)), references["bert"], "num_workers=2")


@pytest.mark.parametrize(
    ("world", "parallel"), [(1, {}), pytest.param(2, {"pipeline": 2}, marks=pytest.mark.slow)]
)
def test_fast_mode_stop_and_resume_gives_the_uninterrupted_losses(
    tmp_path: Path, references: dict[str, list[float]], world: int, parallel: dict
) -> None:
    for got in _launch(_stop_then_resume, "bert", world, parallel, {}, str(tmp_path)):
        _assert_same(got, references["bert"], f"stopped at {EXIT} and resumed, {parallel}")


def test_fast_mode_resume_on_a_smaller_world_gives_the_uninterrupted_losses(
    tmp_path: Path, references: dict[str, list[float]]
) -> None:
    """Saved by DP=2 with ZeRO-2 after step EXIT, resumed by one process (accumulation 4)."""
    run = str(tmp_path / "run")
    first = _launch(_losses, "bert", 2, {"data": 2, "zero_stage": 2}, {"exit_at_step": EXIT}, run)
    rest = _launch(_losses, "bert", 1, {}, {"resume": "auto"}, run)[0]
    _assert_same(first[0] + rest, references["bert"], "DP=2 then one process")


@pytest.mark.parametrize(
    "parallel", [{"data": 2}, pytest.param({"pipeline": 2}, marks=pytest.mark.slow)]
)
def test_fast_mode_finetuning_layout_gives_the_one_process_run(
    tmp_path: Path, parallel: dict
) -> None:
    """Fine-tuning (RTE-style pairs, dropout 0.1, 2 epochs, micro-batch 4 of the batch of 8):
    DP=2 and pipeline=2 under fast give the one-process run's losses and dev predictions."""
    config = _rte_config(tmp_path, rng="fast")
    config = replace(config, trainer=replace(config.trainer, micro_batch_size=4))
    one = ParallelContext.single(device="cpu", rng="fast")
    want_pred, want_losses = _predictions(one, config, str(tmp_path / "one"))
    config = replace(config, parallel=replace(config.parallel, **parallel))
    world = 2
    ranks = run_distributed(
        _predictions, world, config, str(tmp_path / "many"), rng="fast", **parallel
    )
    for rank, (pred, losses) in enumerate(ranks):
        assert torch.equal(pred, want_pred), rank
        _assert_close_curve(losses, want_losses, f"fine-tuning {parallel} rank {rank}")


def _assert_close_curve(got: list[float], want: list[float], what: str) -> None:
    assert len(got) == len(want), (what, got, want)
    worst = max(abs(g - w) / abs(w) for g, w in zip(got, want, strict=True))
    print(f"fast invariance: {what}: max relative loss difference {worst:.1e}")  # -s shows it
    assert worst <= FP32_MODEL_REL, (what, got, want)
