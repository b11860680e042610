"""trainer.compile in the layouts: each block's forward compiled by torch.compile (inductor)
gives the eager run's losses (dropout on) at TP=1, TP=2, TP=2 + SP (fast, with the TP collectives
as functional collectives inside the graphs; and exact), ZeRO-3 and pipeline=2, with selective
and full recomputation among them; under fast the TP ranks' replicated weights stay bitwise
equal (they share those masks). That the eager runs themselves equal their references is held
by tests/train/test_fast_invariance.py (fast) and the layout tests (exact)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch
from torch._dynamo.utils import counters

from tests.dist import run_distributed
from tests.pipeline.test_pipeline_training import pipeline_config
from tests.tolerances import FP32_MODEL_REL
from tpformer.config.schema import Config
from tpformer.parallel.context import ParallelContext
from tpformer.train.pretraining import pretraining_trainer

FULL = {"recompute": "full"}
SP = {"tensor": 2, "sequence_parallel": True}
# (world, run_distributed kwargs, parallel keys, micro, accum, parallel.rng). The TP=1 layouts
# share one block shape (micro-batch 2, selective recomputation), so inductor compiles it once and
# the others load it from its cache: 37 s + 11 s + 11 s on 2 cores against 37 s + 46 s + 57 s.
LAYOUTS = [
    (1, {}, {"recompute": "selective"}, 2, 4, "fast"),
    (2, {"tensor": 2}, {}, 8, 1, "fast"),
    (2, SP, FULL, 8, 1, "fast"),
    (2, SP, FULL, 8, 1, "exact"),
    (2, {}, {"zero_stage": 3, "recompute": "selective"}, 2, 2, "fast"),
    (2, {"pipeline": 2}, {"recompute": "selective"}, 2, 4, "fast"),
]


def _run(ctx: ParallelContext, config: Config, run_dir: Path) -> tuple[list[float], dict]:
    """Losses, and the LayerNorm weights (replicated over TP; without sequence parallelism
    their gradients are not reduced over TP) when this rank holds them whole."""
    trainer = pretraining_trainer(config, ctx, run_dir)
    losses = [r["loss"] for r in trainer.train()]
    norms = {}
    if ctx.tp.size > 1 and config.parallel.zero_stage < 3:
        norms = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if "norm" in n}
    return losses, norms


def _eager_and_compiled(ctx: ParallelContext, config: Config, run_dir: str) -> dict:
    """Both runs on the same ranks, and how many graphs torch.compile captured."""
    results = {}
    for compiled in (False, True):
        counters.clear()
        run = replace(config, trainer=replace(config.trainer, compile=compiled))
        results[compiled] = _run(ctx, run, Path(run_dir) / str(compiled))
    return {**results, "graphs": counters["stats"]["unique_graphs"]}


@pytest.mark.slow  # inductor compiles each layout's graphs: 10-30 s per layout on 2 cores
@pytest.mark.parametrize(("world", "layout", "keys", "micro", "accum", "rng"), LAYOUTS)
def test_compiled_blocks_give_the_eager_losses_in_each_layout_and_rng_mode(
    tmp_path: Path,
    world: int,
    layout: dict,
    keys: dict,
    micro: int,
    accum: int,
    rng: str,
) -> None:
    config = pipeline_config(micro=micro, accum=accum, **keys, **layout)
    if world == 1:
        ctx = ParallelContext.single(device="cpu", rng=rng)
        ranks = [_eager_and_compiled(ctx, config, str(tmp_path))]
    else:
        ranks = run_distributed(
            _eager_and_compiled, world, config, str(tmp_path), rng=rng, **layout
        )
    for result in ranks:
        assert result["graphs"] > 0
        (eager, _), (compiled, _) = result[False], result[True]
        for got, want in zip(compiled, eager, strict=True):
            assert abs(got - want) <= FP32_MODEL_REL * want, result
    tp = layout.get("tensor", 1)
    for first in range(0, world, tp):  # each TP group's ranks hold the same replicated weights
        for rank in range(first + 1, first + tp):
            for compiled in (False, True):
                norms, others = ranks[first][compiled][1], ranks[rank][compiled][1]
                assert norms and norms.keys() == others.keys()
                assert all(torch.equal(norms[n], others[n]) for n in norms), (rank, compiled)
