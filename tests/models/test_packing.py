"""Packed documents (data.pack): several documents in one sequence, each attending only within
itself, its positions restarting at 0, give each document the losses and gradients it gets run
alone in a sequence of its own (fp32, FP32_MODEL_REL) -- for learned positions (BERT, GPT-2),
rotary ones with grouped key/value heads (Llama) and rotary ones with local windows
(ModernBERT) -- and the same at TP=2 with sequence parallelism as in one process."""

from __future__ import annotations

import pytest
import torch

from tests.dist import run_distributed
from tests.models.common import full_grads, tiny_bert, tiny_gpt, tiny_llama, tiny_modernbert
from tests.models.test_sequence_parallel import sum_sequence_parallel_grads
from tests.tolerances import FP32_MODEL_REL, assert_rel_close, rel_err, seeded
from tpformer.config.schema import ModelConfig
from tpformer.layers.sequence import document_mask
from tpformer.models import build_model
from tpformer.parallel.context import ParallelContext

SEQ = 12
LENGTHS = (7, 10, 5)
PACKED = ((0, 2), (1,))
"""Sequence 0 holds documents 0 and 2 (7 + 5 tokens, full), sequence 1 document 1 and two
positions of padding."""
FAMILIES = {"bert": tiny_bert, "gpt2": tiny_gpt, "llama": tiny_llama, "modernbert": tiny_modernbert}
CAUSAL = ("gpt2", "llama")
INIT_STD = 0.3
"""Weights large enough that attention shapes every row: what one document would take from
another changes the loss by far more than the tolerance (the negative control)."""


def _documents() -> list[torch.Tensor]:
    return [torch.randint(5, 99, (n,), generator=seeded(20 + i)) for i, n in enumerate(LENGTHS)]


def _labels(doc: torch.Tensor, index: int, causal: bool) -> torch.Tensor:
    """A document's labels: its tokens (causal; the first is no target) or ~40% of them (MLM)."""
    if causal:
        return doc.clone()
    chosen = torch.rand(len(doc), generator=seeded(40 + index)) < 0.4
    chosen[index % len(doc)] = True
    return torch.where(chosen, doc, -100)


def _arranged(groups: tuple[tuple[int, ...], ...], only: int | None, causal: bool) -> dict:
    """The documents laid out `groups` per sequence (padding after), labels kept for document
    `only` (None: all); with `position_ids` when some sequence holds several."""
    docs = _documents()
    rows = len(groups)
    ids = torch.zeros(rows, SEQ, dtype=torch.long)
    labels = torch.full((rows, SEQ), -100)
    attention = torch.zeros(rows, SEQ, dtype=torch.long)
    positions = torch.zeros(rows, SEQ, dtype=torch.long)
    for r, group in enumerate(groups):
        at = 0
        for d in group:
            n = len(docs[d])
            ids[r, at : at + n] = docs[d]
            attention[r, at : at + n] = 1
            positions[r, at:] = torch.arange(SEQ - at)
            if only is None or only == d:
                labels[r, at : at + n] = _labels(docs[d], d, causal)
            if causal:
                labels[r, at] = -100  # a document's first token is predicted by nothing
            at += n
    batch = {"input_ids": ids, "attention_mask": attention}
    if any(len(g) > 1 for g in groups):
        batch["position_ids"] = positions
    key = "labels" if causal else "mlm_labels"
    return batch | {key: labels}


def _loss_sum(family: str, batch: dict, ctx: ParallelContext) -> tuple[torch.Tensor, dict]:
    """The summed loss of `batch` and every gradient of it, from the same initial weights."""
    config: ModelConfig = FAMILIES[family](init_std=INIT_STD)
    causal = family in CAUSAL
    torch.manual_seed(0)
    model = build_model(config, ctx, task="causal_lm" if causal else "pretraining")
    if causal:
        out = model(**batch)
        total = out.loss_sum
    else:
        batch = {k: v for k, v in batch.items()}
        out = model(**batch)
        total = out.mlm_loss_sum
    total.backward()
    sum_sequence_parallel_grads(model, ctx)
    return total.detach(), full_grads(model, ctx)


ALONE = tuple((d,) for d in range(len(LENGTHS)))


@pytest.mark.parametrize("family", list(FAMILIES))
def test_packed_documents_equal_documents_alone(family: str) -> None:
    ctx = ParallelContext.single(device="cpu")
    causal = family in CAUSAL
    for only in range(len(LENGTHS)):  # each document's own loss
        packed, _ = _loss_sum(family, _arranged(PACKED, only, causal), ctx)
        alone, _ = _loss_sum(family, _arranged(ALONE, only, causal), ctx)
        assert packed.item() > 0
        assert rel_err(packed, alone) <= FP32_MODEL_REL, (family, only)
    packed, packed_grads = _loss_sum(family, _arranged(PACKED, None, causal), ctx)
    alone, alone_grads = _loss_sum(family, _arranged(ALONE, None, causal), ctx)
    assert rel_err(packed, alone) <= FP32_MODEL_REL
    for name, grad in alone_grads.items():
        assert_rel_close(packed_grads[name], grad, FP32_MODEL_REL, name)


def test_without_the_document_mask_the_packed_loss_differs() -> None:
    """Negative control: the same packed batch with its documents' positions but a plain
    padding mask (documents see each other) is not the documents' loss."""
    ctx = ParallelContext.single(device="cpu")
    batch = _arranged(PACKED, 0, causal=False)
    packed, _ = _loss_sum("bert", batch, ctx)
    alone, _ = _loss_sum("bert", _arranged(ALONE, 0, causal=False), ctx)
    assert rel_err(packed, alone) <= FP32_MODEL_REL
    config = tiny_bert(init_std=INIT_STD)
    torch.manual_seed(0)
    model = build_model(config, ctx, task="pretraining")
    model.bert.block_mask = lambda attention_mask, position_ids=None: (  # type: ignore[method-assign]
        attention_mask.bool()[:, None, None, :]
    )
    leaked = model(**batch).mlm_loss_sum
    assert rel_err(leaked, alone) > 1e-3


def test_document_mask_keeps_each_query_in_its_document() -> None:
    positions = torch.tensor([[0, 1, 2, 0, 1, 2, 3]])
    padding = torch.tensor([[1, 1, 1, 1, 1, 0, 0]])
    mask = document_mask(positions, padding, causal=False)[0, 0]
    assert mask[:3, :3].all() and not mask[:3, 3:].any()
    assert mask[3:, 3:5].all() and not mask[3:, 5:].any() and not mask[3:, :3].any()
    causal = document_mask(positions, None, causal=True)[0, 0]
    assert causal[4, 3] and not causal[3, 4] and not causal[4, 2]


def _packed_step(ctx: ParallelContext, family: str) -> dict:
    loss, grads = _loss_sum(family, _arranged(PACKED, None, family in CAUSAL), ctx)
    return {"loss": loss, "grads": grads}


@pytest.mark.sweep
@pytest.mark.parametrize("family", ["llama", "modernbert", "bert", "gpt2"])
def test_packed_documents_at_tp2_with_sequence_parallelism(family: str) -> None:
    reference = _packed_step(ParallelContext.single(device="cpu"), family)
    for result in run_distributed(_packed_step, 2, family, tensor=2, sequence_parallel=True):
        assert rel_err(result["loss"], reference["loss"]) <= FP32_MODEL_REL
        for name, grad in reference["grads"].items():
            assert_rel_close(result["grads"][name], grad, FP32_MODEL_REL, name)
