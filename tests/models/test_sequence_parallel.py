"""Sequence parallelism (Megatron-SP) against the one-process model: a transformer layer and
whole BERT/GPT/classification models at TP=2/4, dropout on and off; its communication counted
in calls and bytes against plain TP; the heads' row fetches."""

import pytest
import torch

from tests.dist import run_distributed
from tests.models.common import (
    BATCH,
    SEQ,
    bert_batch,
    full_grads,
    tiny_bert,
    tiny_gpt,
    tiny_llama,
    tiny_modernbert,
)
from tests.tolerances import (
    FP32_LAYER_REL,
    FP32_MODEL_REL,
    assert_rel_close,
    rel_err,
    seeded,
    shard,
)
from tpformer.config.schema import NormConfig, NormPosition
from tpformer.layers.block import TransformerLayer
from tpformer.layers.dropout import assign_dropout_sites
from tpformer.layers.sequence import labeled_positions, rows_at
from tpformer.models import build_model
from tpformer.parallel.comm import all_reduce, count_collectives
from tpformer.parallel.context import ParallelContext
from tpformer.parallel.init import gather_full, initialize_parameters
from tpformer.parallel.param_info import param_info


def sum_sequence_parallel_grads(model: torch.nn.Module, ctx: ParallelContext) -> None:
    """What the engine's step does: the marked parameters' partial gradients summed over TP."""
    for p in model.parameters():
        if param_info(p).sequence_parallel and p.grad is not None:
            all_reduce(p.grad, ctx.tp)


def _layer(ctx: ParallelContext, dropout: float, pre_norm: bool) -> dict:
    config = tiny_bert(
        dropout, norm=NormConfig(position=NormPosition.pre if pre_norm else NormPosition.post)
    )
    layer = TransformerLayer(config, ctx, causal=pre_norm)
    initialize_parameters(layer, ctx.rng, ctx.tp, std=0.2)
    assign_dropout_sites(layer)
    ctx.rng.set_position(step=2, sample_offset=4)
    x = torch.randn(BATCH, SEQ, config.hidden_size, generator=seeded(5))
    if ctx.sequence_parallel:
        x = shard(x, 1, ctx.tp.rank, ctx.tp.size)
    x.requires_grad_()
    weights = torch.randn(BATCH, SEQ, config.hidden_size, generator=seeded(6))
    if ctx.sequence_parallel:
        weights = shard(weights, 1, ctx.tp.rank, ctx.tp.size)
    with count_collectives() as forward:
        y = layer(x)
    with count_collectives() as backward:
        (y * weights).sum().backward()
    sum_sequence_parallel_grads(layer, ctx)
    return {
        "y": y.detach(),
        "x_grad": x.grad,
        "grads": full_grads(layer, ctx),
        "forward": dict(forward),
        "backward": dict(backward),
        "forward_bytes": sum(forward.bytes.values()),
        "backward_bytes": sum(backward.bytes.values()),
    }


@pytest.mark.parametrize("pre_norm", [False, True])
@pytest.mark.parametrize("dropout", [0.0, 0.2])
@pytest.mark.parametrize("tp", [2, 4])
def test_layer_matches_single_process_and_moves_tp_bytes(
    tp: int, dropout: float, pre_norm: bool
) -> None:
    """Each rank's output and input gradient are its sequence chunk of the one-process layer's;
    parameter gradients (LayerNorms and row biases summed over TP) equal. Per layer: 2
    all-gathers + 2 reduce-scatters forward, as many bytes as plain TP's two all-reduces; in
    backward their mirror (2 reduce-scatters + 2 all-gathers) plus the 2 all-gathers that
    re-gather the column inputs instead of keeping them (Korthikanti et al. 4.2.2): 1.5x TP's
    backward bytes. No all-reduce either way."""
    reference = _layer(ParallelContext.single(device="cpu"), dropout, pre_norm)
    plain = run_distributed(_layer, tp, dropout, pre_norm, tensor=tp)[0]
    assert plain["forward"] == plain["backward"] == {"all_reduce": 2}
    for rank, result in enumerate(
        run_distributed(_layer, tp, dropout, pre_norm, tensor=tp, sequence_parallel=True)
    ):
        assert_rel_close(result["y"], shard(reference["y"], 1, rank, tp), FP32_LAYER_REL, "y")
        assert_rel_close(
            result["x_grad"], shard(reference["x_grad"], 1, rank, tp), FP32_LAYER_REL, "x grad"
        )
        for name, grad in reference["grads"].items():
            assert_rel_close(result["grads"][name], grad, FP32_LAYER_REL, name)
        assert result["forward"] == {"all_gather": 2, "reduce_scatter": 2}
        assert result["backward"] == {"all_gather": 2 + 2, "reduce_scatter": 2}
        assert result["forward_bytes"] == pytest.approx(plain["forward_bytes"], rel=1e-12)
        assert result["backward_bytes"] == pytest.approx(1.5 * plain["backward_bytes"], rel=1e-12)
        assert result["forward_bytes"] > 0


def _model_step(ctx: ParallelContext, task: str, dropout: float) -> dict:
    batch = bert_batch()
    ctx.rng.set_position(step=3, sample_offset=0)
    if task in ("causal_lm", "llama", "llama_kv2"):
        config = tiny_gpt(dropout) if task == "causal_lm" else tiny_llama(dropout)
        if task == "llama_kv2":  # TP=2 splits the two key/value heads, TP=4 replicates them
            config = tiny_llama(dropout, kv_heads=2)
        model = build_model(config, ctx, task="causal_lm")

        def run():
            return model(
                batch["input_ids"],
                attention_mask=batch["attention_mask"],
                labels=batch["input_ids"],
            )
    elif task in ("classification", "modernbert_cls", "modernbert_global_cls"):
        config = tiny_bert(dropout)
        if task != "classification":  # mean pooling; no window: context parallelism takes it
            config = tiny_modernbert(
                dropout, **({"local_attention": None} if "global" in task else {})
            )
        model = build_model(config, ctx, task="classification", num_labels=3)

        def run():
            return model(
                batch["input_ids"],
                batch["token_type_ids"],
                batch["attention_mask"],
                labels=torch.tensor([0, 2, 1, 2]),
            )
    else:
        model = build_model(tiny_bert(dropout), ctx, task=task)
        run = lambda: model(**batch)  # noqa: E731
    with count_collectives() as forward:
        out = run()
    with count_collectives() as backward:
        out.loss.backward()
    sum_sequence_parallel_grads(model, ctx)
    return {
        "loss": out.loss.item(),
        "grads": full_grads(model, ctx),
        "forward": dict(forward),
        "backward": dict(backward),
    }


@pytest.mark.parametrize(
    "task",
    ["pretraining", "causal_lm", "classification", "llama", "llama_kv2", "modernbert_cls"],
)
@pytest.mark.parametrize("dropout", [0.0, 0.2])
@pytest.mark.parametrize("tp", [2, 4])
def test_model_matches_single_process(task: str, dropout: float, tp: int) -> None:
    reference = _model_step(ParallelContext.single(device="cpu"), task, dropout)
    for result in run_distributed(
        _model_step, tp, task, dropout, tensor=tp, sequence_parallel=True
    ):
        assert (
            rel_err(torch.tensor(result["loss"]), torch.tensor(reference["loss"])) <= FP32_MODEL_REL
        )
        for name, grad in reference["grads"].items():
            assert_rel_close(result["grads"][name], grad, FP32_MODEL_REL, name)


def test_pretraining_communication_has_no_all_reduce_outside_the_heads() -> None:
    """BERT pretraining with SP, 2 layers: forward 2+2 per layer, the embedding's
    reduce-scatter, one broadcast of the first token to the pooler, one all-reduce of the
    labeled rows (each rank contributes those it holds), the loss's 3 all-reduces; backward the
    layers' mirror and re-gathers, the embedding's all-gather, and the MLM head's copy_to_tp
    (its projection is vocab-parallel)."""
    result = run_distributed(_model_step, 2, "pretraining", 0.1, tensor=2, sequence_parallel=True)[
        0
    ]
    assert result["forward"] == {
        "all_gather": 2 * 2,
        "reduce_scatter": 2 * 2 + 1,
        "broadcast": 1,
        "all_reduce": 1 + 3,
    }
    assert result["backward"] == {"all_gather": 2 * 4 + 1, "reduce_scatter": 2 * 2, "all_reduce": 1}


def _labels() -> torch.Tensor:
    labels = torch.full((BATCH, SEQ), -100)
    labels[1, 0], labels[2, 7], labels[2, 11], labels[3, 5] = 4, 5, 6, 7  # none on some ranks
    return labels


def _rows(ctx: ParallelContext) -> dict:
    hidden = torch.randn(BATCH, SEQ, 8, generator=seeded(1))
    positions = labeled_positions(_labels(), multiple=1)
    local = shard(hidden, 1, ctx.tp.rank, ctx.tp.size).clone().requires_grad_()
    with count_collectives() as calls:
        rows, held = rows_at(local, positions, SEQ, ctx.tp, True, ctx.cp)
    (rows * torch.arange(rows.numel(), dtype=rows.dtype).view_as(rows)).sum().backward()
    return {"rows": rows.detach(), "held": held, "grad": local.grad, "calls": dict(calls)}


@pytest.mark.parametrize("tp", [2, 4])
def test_rows_at_labeled_positions_match_plain_indexing(tp: int) -> None:
    """The positions come with the batch ([b, P], labeled first, then padding); under SP each
    rank contributes the rows it holds and one all-reduce replicates them (no count is read on
    the host); gradients reach the rank that holds each row."""
    labels = _labels()
    positions = labeled_positions(labels, multiple=1)
    assert positions.shape == (BATCH, 2)  # the most labels in one sequence
    assert positions[2].tolist() == [7, 11] and positions[3, 0] == 5
    hidden = torch.randn(BATCH, SEQ, 8, generator=seeded(1)).requires_grad_()
    rows = hidden.gather(1, positions.unsqueeze(-1).expand(-1, -1, 8))
    (rows * torch.arange(rows.numel(), dtype=rows.dtype).view_as(rows)).sum().backward()
    for rank, result in enumerate(run_distributed(_rows, tp, tensor=tp)):
        assert torch.equal(result["rows"], rows.detach())
        assert bool(result["held"].all())
        assert torch.equal(result["grad"], shard(hidden.grad, 1, rank, tp))
        assert result["calls"] == {"all_reduce": 1}


def _logits_without_labels(ctx: ParallelContext) -> torch.Tensor:
    model = build_model(tiny_bert(), ctx, task="pretraining")
    batch = {k: v for k, v in bert_batch().items() if k not in ("mlm_labels", "nsp_labels")}
    logits = model(**batch).mlm_logits.transpose(0, -1)  # the vocabulary first, as mlm_bias
    return gather_full(model.mlm_bias, ctx.tp, logits).transpose(0, -1)


@pytest.mark.parametrize("tp", [2, 4])
def test_logits_without_labels_cover_every_position(tp: int) -> None:
    """No labels: the MLM head gets the whole sequence, gathered in order, under SP too."""
    reference = _logits_without_labels(ParallelContext.single(device="cpu"))
    for logits in run_distributed(_logits_without_labels, tp, tensor=tp, sequence_parallel=True):
        assert_rel_close(logits, reference, FP32_MODEL_REL, "logits")
