"""Activation checkpointing: bitwise-equal gradients, ZeRO-3 composition, memory actually saved."""

from dataclasses import replace

import pytest
import torch

from tests.dist import run_distributed
from tests.models.common import bert_batch, full_grads, tiny_bert
from tpformer.config.rules.parallel import validate_engine, validate_recompute_granularity
from tpformer.config.schema import OptimConfig, ParallelConfig
from tpformer.engine import build_engine
from tpformer.engine.memory import measure_saved_activations
from tpformer.engine.recompute import apply_recompute
from tpformer.models import build_model
from tpformer.parallel.context import ParallelContext
from tpformer.parallel.init import full_state_dict

MODES = [
    ParallelConfig(recompute="selective"),
    ParallelConfig(recompute="full"),
    ParallelConfig(recompute="full", recompute_offload=True),
    ParallelConfig(recompute="full", recompute_num_layers=1),
]


def _grads(ctx: ParallelContext, parallel: ParallelConfig) -> dict[str, torch.Tensor]:
    model = build_model(tiny_bert(dropout=0.2), ctx, task="pretraining")
    apply_recompute(model, parallel, ctx.rng)
    ctx.rng.set_position(step=2, sample_offset=0)
    model(**bert_batch()).loss.backward()
    ctx.rng.set_position(step=99, sample_offset=50)  # backward must not depend on the position now
    return full_grads(model, ctx)


def _all_modes(ctx: ParallelContext) -> list[dict[str, torch.Tensor]]:
    return [_grads(ctx, mode) for mode in [ParallelConfig(), *MODES]]


@pytest.mark.parametrize("rng", ["exact", "fast"])
@pytest.mark.parametrize("tp", [1, 2])
def test_gradients_are_bitwise_equal_with_dropout(tp: int, rng: str) -> None:
    """Recomputation redraws the forward's masks in both RNG modes (fast: the attention core's
    fused-kernel dropout included)."""
    for results in run_distributed(_all_modes, tp, tensor=tp, rng=rng):
        reference = results[0]
        for mode, grads in zip(MODES, results[1:]):
            for name, grad in reference.items():
                assert torch.equal(grads[name], grad), f"{mode.recompute} {name}"


def _zero3(ctx: ParallelContext, mode: str) -> dict[str, torch.Tensor]:
    model = build_model(tiny_bert(dropout=0.2), ctx, task="pretraining")
    parallel = ParallelConfig(zero_stage=3, recompute=mode)
    apply_recompute(model, parallel, ctx.rng)
    engine = build_engine(model, OptimConfig(lr=1e-3), parallel, ctx)
    batch = bert_batch()
    per = batch["input_ids"].shape[0] // ctx.dp.size
    for step in range(3):
        ctx.rng.set_position(step, ctx.dp.rank * per)
        part = {k: v[ctx.dp.rank * per : (ctx.dp.rank + 1) * per] for k, v in batch.items()}
        engine.backward(model(**part).loss / ctx.dp.size)
        engine.step()
    with engine.gathered():
        return full_state_dict(model, ctx.tp)


def _zero3_modes(ctx: ParallelContext) -> list[dict[str, torch.Tensor]]:
    return [_zero3(ctx, mode) for mode in ("none", "selective", "full")]


def test_zero3_with_checkpointing_is_bitwise_equal() -> None:
    for none, selective, full in run_distributed(_zero3_modes, 4, tensor=2):
        for name, value in none.items():
            assert torch.equal(selective[name], value), name
            assert torch.equal(full[name], value), name


# ----------------------------------------------------------------------------- memory

SEQ_LONG, LAYERS = 512, 12


def saved_bytes(mode: str) -> tuple[int, list[int], int]:
    """(bytes saved for backward, per-layer part, one layer input's bytes) of one forward."""
    ctx = ParallelContext.single(device="cpu")
    config = tiny_bert(
        dropout=0.1, hidden_size=64, num_layers=LAYERS, max_position_embeddings=SEQ_LONG
    )
    model = build_model(config, ctx, task="pretraining")
    apply_recompute(model, ParallelConfig(recompute=mode), ctx.rng)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(5, 99, (1, SEQ_LONG), generator=g)
    labels = torch.where(torch.rand(1, SEQ_LONG, generator=g) < 0.15, ids, -100)
    saved = measure_saved_activations(model, lambda: model(ids, mlm_labels=labels).loss)
    return saved.total, saved.per_layer, SEQ_LONG * config.hidden_size * 4


def test_checkpointing_saves_the_activation_memory_it_promises() -> None:
    none_total, none_layers, layer_input = saved_bytes("none")
    full_total, full_layers, _ = saved_bytes("full")
    sel_total, sel_layers, _ = saved_bytes("selective")
    outside = none_total - sum(none_layers)
    heads, seq = 4, SEQ_LONG
    attention_core = heads * seq * seq * (4 + 4 + 1)  # scores, probs (fp32) and the dropout mask
    # full: every layer keeps only its input [b, s, hidden]
    assert full_layers == [layer_input] * LAYERS
    assert full_total <= outside + LAYERS * layer_input
    # selective: each layer drops at least its s x s attention tensors
    for none_layer, sel_layer in zip(none_layers, sel_layers):
        assert none_layer - sel_layer >= attention_core
        assert sel_layer > 0
    assert sel_total < none_total * 0.5 and full_total < sel_total


def test_bad_checkpointing_settings_raise() -> None:
    """The one validator rejects them before anything is built."""
    with pytest.raises(ValueError, match="recompute='some' is not one of"):
        validate_engine(ParallelConfig(recompute="some"), OptimConfig(), "cpu")
    too_many = ParallelConfig(recompute="full", recompute_num_layers=3)
    with pytest.raises(
        ValueError, match=r"recompute_num_layers=3 must be between 0 .* num_layers=2"
    ):
        validate_recompute_granularity(too_many, tiny_bert().num_layers)
    with pytest.raises(ValueError, match="recompute_every=5"):
        validate_recompute_granularity(
            replace(too_many, recompute_num_layers=0, recompute_every=5), tiny_bert().num_layers
        )
