"""The planner's per-layer activation estimate (which the startup plan prints) against
activations measured with saved-tensor hooks, at every TP / sequence-parallel / recomputation
combination it models."""

import pytest
import torch

from tests.dist import run_distributed
from tests.models.common import tiny_bert
from tpformer.config.schema import Config, DataConfig, ParallelConfig, TrainerConfig
from tpformer.engine.memory import measure_saved_activations
from tpformer.engine.recompute import apply_recompute
from tpformer.layers.dropout import dropout_mask_bytes
from tpformer.models import build_model
from tpformer.parallel.context import ParallelContext
from tpformer.planner.candidate import Workload, candidate_of
from tpformer.planner.memory import activation_parts

SEQ, BATCH = 64, 2
PLAN_REL = 0.10
"""The formula counts the big tensors only (not LayerNorm statistics or the padding mask)."""


def _config(tp: int, sp: bool, recompute: str) -> Config:
    model = tiny_bert(dropout=0.1, hidden_size=64, num_layers=2, max_position_embeddings=SEQ)
    return Config(
        model=model,
        data=DataConfig(seq_length=SEQ),
        parallel=ParallelConfig(tensor=tp, sequence_parallel=sp, recompute=recompute),
        trainer=TrainerConfig(micro_batch_size=BATCH),
    )


def _measured(ctx: ParallelContext, config: Config) -> int:
    model = build_model(config.model, ctx, task="pretraining")
    apply_recompute(model, config.parallel, ctx.rng)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, 99, (BATCH, SEQ), generator=g)
    labels = torch.where(torch.rand(BATCH, SEQ, generator=g) < 0.15, ids, -100)
    saved = measure_saved_activations(model, lambda: model(ids, mlm_labels=labels).loss)
    return sum(saved.per_layer)


@pytest.mark.parametrize(
    ("tp", "sp", "recompute"),
    [
        (1, False, "none"),
        (2, False, "none"),
        (2, True, "none"),
        (4, True, "none"),
        (2, True, "selective"),
        (4, False, "selective"),
        (2, True, "full"),
    ],
)
def test_activation_estimate_matches_saved_tensors(tp: int, sp: bool, recompute: str) -> None:
    config = _config(tp, sp, recompute)
    layer, _, _ = activation_parts(
        Workload.of(config, BATCH),
        candidate_of(config, 1),
        mask_bytes=dropout_mask_bytes("cpu", torch.float32),
    )
    estimate = config.model.num_layers * layer
    if tp == 1:
        measured = [_measured(ParallelContext.single(device="cpu"), config)]
    else:
        measured = run_distributed(_measured, tp, config, tensor=tp, sequence_parallel=sp)
    for got in measured:
        assert abs(got - estimate) <= PLAN_REL * estimate, (got, estimate)
