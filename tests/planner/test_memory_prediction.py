"""The planner's memory per rank against a real training step: the engine's accounted model
state (memory_report) plus the activations the step holds when each backward is called
(planner/measure.StepMeter: what autograd saved, the outputs a pipeline stage keeps for their
backward and the gradient it received), for the layouts the planner enumerates on 1, 2 and 4
gloo ranks."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest
import torch

from tests.dist import run_distributed
from tpformer.config.presets import preset
from tpformer.config.schema import Config, DataConfig, OptimConfig, TrainerConfig
from tpformer.data.steps import prepare_step
from tpformer.parallel.context import ParallelContext
from tpformer.planner.candidate import Candidate, Workload, enumerate_candidates
from tpformer.planner.cluster import load_preset, resolve_cluster
from tpformer.planner.measure import StepMeter
from tpformer.planner.memory import predict_memory
from tpformer.train.pretraining import pretraining_trainer

MEMORY_REL = 0.04
"""Measured worst: 0.20% on 1 rank, 3.14% on 2, 3.04% on 4 (2026-11-27, planner/measure.StepMeter's
activations); the formulas leave out LayerNorm statistics, the attention's log-sum-exp, the
batch's integer tensors and bucket padding, a larger share at these tiny shapes."""
GLOBAL_BATCH, MAX_MICRO = 4, 2


def base_config() -> Config:
    model = preset(
        "bert_tiny",
        vocab_size=256,
        hidden_size=64,
        num_heads=4,
        num_layers=4,
        intermediate_size=256,
        max_position_embeddings=64,
        dropout=0.1,
        attention_dropout=0.1,
    )
    return Config(
        model=model,
        optim=OptimConfig(lr=1e-3, warmup_steps=1),
        data=DataConfig(source="synthetic", seq_length=64),
        trainer=TrainerConfig(
            max_steps=2, log_every=1, eval_steps=1, progress=False, loggers=[], plot=False
        ),
    )


def _work() -> Workload:
    return Workload.of(base_config(), GLOBAL_BATCH)


def _measure(ctx: ParallelContext, layouts: list[Candidate], run_dir: str) -> list[float]:
    """Each layout on its mesh over the same ranks (one mesh per tp x dp x pp x SP, reused by the
    layouts that share it: the bytes do not depend on the groups, and building them cost a
    third of the four-rank run), one step, then the bytes."""
    logging.disable(logging.INFO)
    meshes: dict[tuple, ParallelContext] = {}
    out = []
    for i, c in enumerate(layouts):
        key = (c.tp, c.dp, c.pp, c.sequence_parallel)
        if key not in meshes:
            meshes[key] = (
                ParallelContext.single(device="cpu")
                if ctx.layout.world_size == 1
                else ParallelContext.create(
                    c.tp,
                    c.dp,
                    pipeline=c.pp,
                    device=torch.device("cpu"),
                    sequence_parallel=c.sequence_parallel,
                )
            )
        mesh = meshes[key]
        directory = Path(run_dir) / str(i)
        directory.mkdir(parents=True, exist_ok=True)
        trainer = pretraining_trainer(c.apply(base_config()), mesh, directory)
        trainer.run_step(0, trainer.task.train_batches, train=True)  # the model state made
        trainer.engine.step()
        prepared = prepare_step(trainer.task.train_batches, trainer.task.objective, 1)
        with StepMeter() as meter:
            trainer.queue_step(prepared, train=True)
        trainer.engine.step()
        out.append(float(trainer.engine.memory_report().total + meter.held))
    return out


def _check(world: int, layouts: list[Candidate], tmp_path: Path) -> None:
    cluster = resolve_cluster(load_preset("cpu"), "fp32", cache_dir=str(tmp_path))
    if world == 1:
        measured = [
            [m] for m in _measure(ParallelContext.single(device="cpu"), layouts, str(tmp_path))
        ]
    else:
        per_rank = run_distributed(_measure, world, layouts, str(tmp_path), timeout_s=600)
        measured = [list(ms) for ms in zip(*per_rank)]
    errors = []
    for c, ranks in zip(layouts, measured):
        predicted = predict_memory(_work(), c, cluster).accounted
        got = max(ranks)  # the prediction is the most loaded stage's
        errors.append((abs(got - predicted) / got, c.label(), got, predicted))
    worst = max(errors)
    print(
        f"world {world}: {len(errors)} layouts, worst error {worst[0]:.2%} ({worst[1]}: "
        f"measured {worst[2]:,.0f} B, predicted {worst[3]:,.0f} B)"
    )
    assert worst[0] <= MEMORY_REL, f"worst of {len(errors)}: {worst}"


def _layouts(world: int) -> list[Candidate]:
    return list(
        enumerate_candidates(_work(), world, world, max_micro_batch=MAX_MICRO, device_type="cpu")
    )


@pytest.mark.sweep
@pytest.mark.parametrize("world", [1, 2])
def test_predicted_memory_matches_every_layout(world: int, tmp_path: Path) -> None:
    start = time.perf_counter()
    _check(world, _layouts(world), tmp_path)
    print(f"{len(_layouts(world))} layouts in {time.perf_counter() - start:.0f} s")


FOUR_RANK_SHARE = 3
"""At 4 ranks one enumerated layout in 3 (50 of 150) runs: each costs about 4 s of 4 processes
on 2 cores (fresh process groups, a built trainer, one step), and all 150 took 637 s, past the
600 s rank timeout (every other one kept the suite over its 20 minutes)."""


def _one_in(layouts: list, n: int) -> list:
    """One layout in n, the kept position rotating from block to block: a plain stride of 3
    would keep one recomputation mode only (the innermost choice has 3 values); this keeps
    every tp x pp x ZeRO stage and every sequence-parallel x recomputation pair."""
    return [c for i, c in enumerate(layouts) if i % n == (i // n) % n]


@pytest.mark.slow
def test_predicted_memory_matches_four_ranks(tmp_path: Path) -> None:
    _check(4, _one_in(_layouts(4), FOUR_RANK_SHARE), tmp_path)


def _whole_gradient_peaks(ctx: ParallelContext, bucket_mbs: list[float], run_dir: str) -> list:
    """ZeRO-2 at dp=2 (two micro-batches per step): the bytes of the engine's pooled gradient
    buffers after a step (whole buckets, and the shard-size buffers the second micro-batch's
    reductions land in; the pool keeps as many as were in use at once), per
    parallel.bucket_mb."""
    from dataclasses import replace

    logging.disable(logging.INFO)
    peaks = []
    for i, bucket_mb in enumerate(bucket_mbs):
        config = BUCKETED.apply(base_config())
        config = replace(config, parallel=replace(config.parallel, bucket_mb=bucket_mb))
        directory = Path(run_dir) / str(i)
        directory.mkdir(parents=True, exist_ok=True)
        trainer = pretraining_trainer(config, ctx, directory)
        trainer.run_step(0, trainer.task.train_batches, train=True)
        trainer.engine.step()
        peaks.append(trainer.engine.working_bytes())
    return peaks


BUCKETED = Candidate(1, 1, 2, 1, 2, zero_stage=2)


def test_zero2_gradient_buffers_as_the_engine_holds_them(tmp_path: Path) -> None:
    """The planner's ZeRO-2 buffers against the engine's pooled gradient buffers after a real
    step of two micro-batches: one bucket per block (the root's and two layers'; equal, measured
    777,228 B both) and parallel.bucket_mb=0.05 (three buckets of at most the cap or one larger
    parameter: an upper bound, 1.06x here)."""
    from dataclasses import replace

    bucket_mbs = [0.0, 0.05]
    measured = run_distributed(_whole_gradient_peaks, 2, bucket_mbs, str(tmp_path), tensor=1)[0]
    cluster = resolve_cluster(load_preset("cpu"), "fp32", cache_dir=str(tmp_path))
    for bucket_mb, peak in zip(bucket_mbs, measured):
        config = base_config()
        config = replace(config, parallel=replace(config.parallel, bucket_mb=bucket_mb))
        predicted = predict_memory(Workload.of(config, GLOBAL_BATCH), BUCKETED, cluster).buffers
        print(f"bucket_mb={bucket_mb}: predicted {predicted:.0f} B, measured {peak} B")
        assert peak <= predicted <= 1.5 * peak, (bucket_mb, predicted, peak)
    assert measured[1] < measured[0] / 2
