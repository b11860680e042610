"""Each model task at CP=2 (and CP=2 x TP=2 with sequence parallelism) against one process: the
CP ranks' losses are shares of the micro-batch's and their gradients partial sums, so both summed
over the ring must equal the one-process loss and gradients. Covers the heads on position 0
(NSP, classification: run on every CP rank, counted on CP rank 0), GPT's shifted targets, a
Llama-style decoder's rotary positions (each CP rank rotates its own chunks' positions) and a
ModernBERT-style classifier's mean over the tokens (its sums reduced over the ring), with every
layer global and with ModernBERT's local layers, whose window the ring builds from positions
(skipping the blocks out of its reach)."""

from __future__ import annotations

import pytest
import torch

from tests.dist import run_distributed
from tests.models.test_sequence_parallel import _model_step
from tests.tolerances import FP32_MODEL_REL, assert_rel_close, rel_err
from tpformer.parallel.context import ParallelContext


@pytest.mark.parametrize(
    ("task", "dropout", "tp"),
    [
        ("pretraining", 0.2, 1),
        ("causal_lm", 0.2, 1),
        ("classification", 0.0, 1),
        ("classification", 0.2, 2),
        ("llama", 0.0, 1),
        ("llama", 0.2, 2),
        ("modernbert_global_cls", 0.0, 1),
        ("modernbert_global_cls", 0.2, 2),
        ("modernbert_cls", 0.0, 1),
        ("modernbert_cls", 0.2, 2),
    ],
)
def test_model_at_cp2_sums_to_the_single_process_step(task: str, dropout: float, tp: int) -> None:
    reference = _model_step(ParallelContext.single(device="cpu"), task, dropout)
    results = run_distributed(
        _model_step, 2 * tp, task, dropout, tensor=tp, context=2, sequence_parallel=tp > 1
    )
    ring = results[::tp]  # TP rank 0 of each CP rank (TP ranks hold the same gathered values)
    loss = sum(r["loss"] for r in ring)
    assert rel_err(torch.tensor(loss), torch.tensor(reference["loss"])) <= FP32_MODEL_REL
    for name, grad in reference["grads"].items():
        assert_rel_close(sum(r["grads"][name] for r in ring), grad, FP32_MODEL_REL, name)
