"""BERT, GPT-2, a Llama-style decoder and a ModernBERT-style encoder at TP=1/2/4 against the
one-process model: losses, gradients, dropout, communication."""

import pytest
import torch

from tests.dist import run_distributed
from tests.models.common import (
    bert_batch,
    full_grads,
    tiny_bert,
    tiny_gpt,
    tiny_llama,
    tiny_modernbert,
)
from tests.models.test_sequence_parallel import sum_sequence_parallel_grads
from tests.tolerances import FP32_MODEL_REL, assert_rel_close, rel_err
from tpformer.models import build_model
from tpformer.parallel.comm import count_collectives
from tpformer.parallel.context import ParallelContext


def _bert_step(ctx: ParallelContext, dropout: float, modern: bool = False) -> dict:
    config = tiny_modernbert(dropout) if modern else tiny_bert(dropout)
    model = build_model(config, ctx, task="pretraining")
    ctx.rng.set_position(step=3, sample_offset=0)
    out = model(**bert_batch())
    out.loss.backward()
    return {"loss": out.loss.item(), "mlm": out.mlm_loss.item(), "grads": full_grads(model, ctx)}


def _gpt_step(ctx: ParallelContext, dropout: float, llama: bool = False, kv: int = 4) -> dict:
    config = tiny_llama(dropout, kv) if llama else tiny_gpt(dropout)
    model = build_model(config, ctx, task="causal_lm")
    batch = bert_batch()
    out = model(
        batch["input_ids"], attention_mask=batch["attention_mask"], labels=batch["input_ids"]
    )
    out.loss.backward()
    sum_sequence_parallel_grads(model, ctx)  # a replicated key/value weight's, as the engine
    return {"loss": out.loss.item(), "grads": full_grads(model, ctx)}


def _llama_step(ctx: ParallelContext, dropout: float) -> dict:
    return _gpt_step(ctx, dropout, llama=True)


def _multi_query_step(ctx: ParallelContext, dropout: float) -> dict:
    """One key/value head: every TP rank holds it, its gradient summed over TP."""
    return _gpt_step(ctx, dropout, llama=True, kv=1)


def _modernbert_step(ctx: ParallelContext, dropout: float) -> dict:
    """MLM only: the batch's NSP labels find no pair head."""
    return _bert_step(ctx, dropout, modern=True)


STEPS = {
    "bert": _bert_step,
    "gpt": _gpt_step,
    "llama": _llama_step,
    "multi_query": _multi_query_step,
    "modernbert": _modernbert_step,
}


@pytest.mark.parametrize("arch", list(STEPS))
@pytest.mark.parametrize("dropout", [0.0, 0.2])
@pytest.mark.parametrize("tp", [2, 4])
def test_tp_matches_single_process(arch: str, dropout: float, tp: int) -> None:
    step = STEPS[arch]
    reference = step(ParallelContext.single(device="cpu"), dropout)
    for result in run_distributed(step, tp, dropout, tensor=tp):
        assert (
            rel_err(torch.tensor(result["loss"]), torch.tensor(reference["loss"])) <= FP32_MODEL_REL
        )
        for name, grad in reference["grads"].items():
            assert_rel_close(result["grads"][name], grad, FP32_MODEL_REL, name)


def test_dropout_is_bitwise_reproducible_and_active() -> None:
    run = lambda: _bert_step(ParallelContext.single(device="cpu"), 0.2)  # noqa: E731
    first, second = run(), run()
    assert first["loss"] == second["loss"]
    assert first["loss"] != _bert_step(ParallelContext.single(device="cpu"), 0.0)["loss"]
    tp2 = run_distributed(_bert_step, 2, 0.2, tensor=2)
    again = run_distributed(_bert_step, 2, 0.2, tensor=2)
    assert [r["loss"] for r in tp2] == [r["loss"] for r in again]


def _count(ctx: ParallelContext) -> dict[str, int]:
    config = tiny_bert()
    model = build_model(config, ctx, task="pretraining")
    with count_collectives() as forward:
        out = model(**bert_batch())
    with count_collectives() as backward:
        out.loss.backward()
    return {
        "forward": forward["all_reduce"],
        "backward": backward["all_reduce"],
        "other": sum(forward.values())
        + sum(backward.values())
        - forward["all_reduce"]
        - backward["all_reduce"],
        "layers": config.num_layers,
    }


@pytest.mark.parametrize("tp", [2, 4])
def test_bert_pretraining_communication(tp: int) -> None:
    for counts in run_distributed(_count, tp, tensor=tp):
        layers = counts["layers"]
        # forward: 2 per layer + 1 word embedding + 3 in the vocab-parallel loss
        # backward: 2 per layer + 1 at the MLM head's copy_to_tp (embedding and loss: none)
        assert counts["forward"] == 2 * layers + 1 + 3 == 8
        assert counts["backward"] == 2 * layers + 1 == 5
        assert counts["other"] == 0


def test_masked_only_head_equals_full_sequence_head() -> None:
    ctx = ParallelContext.single(device="cpu")
    model = build_model(tiny_bert(), ctx, task="pretraining")
    batch = bert_batch()
    masked = model(**batch)
    logits = model(batch["input_ids"], batch["token_type_ids"], batch["attention_mask"]).mlm_logits
    full = torch.nn.functional.cross_entropy(
        logits[..., :99].reshape(-1, 99), batch["mlm_labels"].reshape(-1)
    )
    assert_rel_close(masked.mlm_loss, full, 1e-6, "masked-only MLM loss")


@pytest.mark.parametrize(
    ("overrides", "tp", "message"),
    [
        ({"hidden_size": 30}, 1, r"model.hidden_size=30 is not divisible by model.num_heads=4"),
        ({}, 3, r"parallel.tensor=3 must divide model.num_heads=4 \(valid: \[1, 2, 4\]\)"),
    ],
)
def test_bad_model_config_raises(overrides: dict, tp: int, message: str) -> None:
    from tpformer.config.rules.model import validate_model

    with pytest.raises(ValueError, match=message):
        validate_model(tiny_bert(**overrides), tp)


def test_sequence_longer_than_positions_raises() -> None:
    model = build_model(tiny_bert(), ParallelContext.single(device="cpu"), task="base")
    with pytest.raises(
        ValueError, match=r"sequence length 40 exceeds model.max_position_embeddings=32"
    ):
        model(torch.zeros(1, 40, dtype=torch.long))
