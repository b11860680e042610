"""Dry runs (train/dry_run.py, tpformer-plan plan.dry_run=true): one rank's real step on the
fake backend and the meta device, held to the planner and the cost model.

Exact: the model state of every rank (parameters, gradients, optimizer state with the fp32
master copy) equals the planner's per-stage prediction in every layout below (under ZeRO,
within the few bytes by which the engine pads each flat bucket to a multiple of dp), and the
executed FLOPs of one rank at TP=1 equal the cost model's count of the executed shapes (on meta,
attention runs a kernel whose backward does not recompute QK^T). Not held, and stated in the
docs: the step's own allocations (activations, temporaries, buffers) against the planner's
activations + buffers; context parallelism, whose ring exchange has no fake-backend path for
the meta device yet."""

from __future__ import annotations

from dataclasses import replace

import pytest

from tpformer.config.presets import preset
from tpformer.config.schema import Config, DataConfig, ParallelConfig, TrainerConfig
from tpformer.layers.embedding import padded_vocab_size
from tpformer.models.costs import step_flops
from tpformer.parallel.layout import resolve_layout
from tpformer.planner.candidate import Workload, candidate_of
from tpformer.planner.cluster import load_preset, resolve_cluster
from tpformer.planner.memory import predict_stage_memory
from tpformer.train.dry_run import dry_run

GRID = [  # (world, rank, parallel keys)
    (2, 0, {"tensor": 2}),
    (2, 1, {"tensor": 2, "sequence_parallel": True}),
    (4, 0, {"tensor": 2, "pipeline": 2}),
    (4, 3, {"tensor": 2, "pipeline": 2}),
    (2, 0, {"zero_stage": 1}),
    (2, 1, {"zero_stage": 2}),
    (4, 0, {"zero_stage": 3}),
    (2, 0, {"tensor": 2, "precision": "bf16"}),
]


def _config(arch: str, **parallel: object) -> Config:
    if arch == "bert":
        model = preset("bert_tiny", vocab_size=500, num_heads=4)
    else:
        model = preset("gpt2_small", vocab_size=500, num_layers=2, hidden_size=128,
                       num_heads=4, intermediate_size=512, max_position_embeddings=128)  # fmt: skip
    return Config(
        model=model,
        parallel=ParallelConfig(**parallel),  # type: ignore[arg-type]
        data=DataConfig(source="synthetic", seq_length=64),  # type: ignore[arg-type]
        trainer=TrainerConfig(micro_batch_size=4, grad_accum=2),
    )


@pytest.mark.parametrize("arch", ["bert", "gpt"])
@pytest.mark.parametrize(("world", "rank", "keys"), GRID)
def test_the_model_state_of_a_rank_is_the_planners(
    arch: str, world: int, rank: int, keys: dict
) -> None:
    config = _config(arch, **keys)
    run = dry_run(config, world, rank)
    p = config.parallel
    layout = resolve_layout(p.tensor, p.data, world, p.pipeline, p.context)  # type: ignore[arg-type]
    work = Workload.of(replace(config, parallel=replace(p, rng="fast")), 8 // 1 * layout.dp)
    cpu = replace(load_preset("cpu"), gpus_per_node=world, nodes=1, calibration="none")
    cluster = resolve_cluster(cpu, "fp32", cache_dir="/nonexistent")
    (predicted,) = predict_stage_memory(
        work, candidate_of(config, layout.dp), cluster, only=[layout.stage_of(rank)]
    )
    measured = (run.params, run.grads, run.optimizer)
    want = (predicted.params, predicted.grads, predicted.optimizer)
    # ZeRO pads each flat bucket to a multiple of dp elements; the planner divides evenly
    padding = 4 * layout.dp * len(measured) if p.zero_stage else 0
    assert all(abs(m - w) <= padding for m, w in zip(measured, want)), (run, predicted)
    assert run.collectives and all(calls > 0 for calls, _ in run.collectives.values())


def test_one_ranks_flops_are_the_cost_models_executed_count() -> None:
    config = _config("gpt")
    run = dry_run(config, 1, 0)
    samples, seq = 8, 64
    padded = padded_vocab_size(config.model.vocab_size, 1, config.model.pad_vocab_to)
    expected = step_flops(
        config.model, samples=samples, seq=seq, head_tokens=samples * seq, task="causal_lm",
        vocab=padded,
    )  # fmt: skip
    assert run.flops_per_step == expected
