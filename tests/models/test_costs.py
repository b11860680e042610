"""The one cost model (models/costs.py) against PyTorch's own FLOP counter: a forward and
backward of every preset's shape on the meta device (two layers: the count is linear in the
layer count; on meta it is the CPU's, held per architecture), for BERT pretraining (MLM on the
labeled rows, NSP), GPT causal LM and BERT classification.

`executed_flops` equals FlopCounterMode exactly. The MFU the loop logs (`step_flops`) counts
the work the task needs instead, and differs in three stated ways: the real vocabulary rather
than the padded one (padding rows), BERT's labeled rows rather than the gathered ones (each
sample's labeled positions padded to the batch's largest count, rounded up to 8 for fewer
distinct shapes), and the fused attention backward's recomputation of QK^T. FlopCounterMode
has no formula for the CPU flash-attention kernel; the test registers PyTorch's own sdpa
formulas for it."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from torch.utils.flop_counter import (
    FlopCounterMode,
    flop_registry,
    register_flop_formula,
    sdpa_backward_flop_count,
    sdpa_flop_count,
)

from tpformer.config.presets import PRESETS
from tpformer.config.schema import LocalAttentionConfig
from tpformer.layers.embedding import padded_vocab_size
from tpformer.models import build_model
from tpformer.models.costs import executed_flops, first_layer_saving, layer_params, step_flops
from tpformer.parallel.context import ParallelContext
from tpformer.train.objectives import objective_for

SAMPLES, SEQ = 2, 16

aten = torch.ops.aten
if aten._scaled_dot_product_flash_attention_for_cpu not in flop_registry:

    @register_flop_formula(aten._scaled_dot_product_flash_attention_for_cpu)
    def _cpu_sdpa(q, k, v, *args, out_shape=None, **kwargs):  # type: ignore[no-untyped-def]
        return sdpa_flop_count(q, k, v)

    @register_flop_formula(aten._scaled_dot_product_flash_attention_for_cpu_backward)
    def _cpu_sdpa_backward(grad, q, k, v, *args, out_shape=None, **kwargs):  # type: ignore[no-untyped-def]
        return sdpa_backward_flop_count(grad, q, k, v)


def _batch(task: str, vocab: int, generator: torch.Generator) -> dict[str, torch.Tensor]:
    ids = torch.randint(5, vocab, (SAMPLES, SEQ), generator=generator)
    if task == "causal_lm":
        return {"input_ids": ids}
    batch = {"input_ids": ids, "token_type_ids": torch.zeros_like(ids)}
    if task == "classification":
        return {**batch, "labels": torch.tensor([0, 1])}
    labels = torch.full_like(ids, -100)
    labels[:, 1:SEQ:5] = ids[:, 1:SEQ:5]  # 3 labeled rows per sample
    return {**batch, "mlm_labels": labels, "nsp_labels": torch.tensor([0, 1])}


def _counted(config, task: str, device: str = "meta") -> tuple[float, float, float]:  # type: ignore[no-untyped-def]
    """(FlopCounterMode's FLOPs of one forward + backward, the labeled rows of the batch, the
    rows the head gathered). On `meta` (shapes only: the 8B presets in 0.1 s instead of a
    minute of building and initializing on the CPU), whose count equals the CPU's
    (test_the_meta_count_is_the_cpu_count)."""
    ctx = ParallelContext.single(device=device)
    extra = {"num_labels": 2} if task == "classification" else {}
    model = build_model(config, ctx, task=task, initialize=device != "meta", **extra)
    objective = objective_for(task, pair_head=config.pooler == "tanh")
    batch = objective.host_inputs(_batch(task, config.vocab_size, torch.Generator().manual_seed(0)))
    counts = torch.tensor(objective.counts(batch), dtype=torch.float64)
    on_device = {k: v.to(device) for k, v in batch.items()}
    with FlopCounterMode(display=False) as counter:
        objective(model, on_device, counts.to(device))[0].backward()
    if task != "pretraining":
        return float(counter.get_total_flops()), 0.0, 0.0
    labeled = float((batch["mlm_labels"] != -100).sum())
    return float(counter.get_total_flops()), labeled, float(batch["mlm_positions"].numel())


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_step_flops_equal_pytorchs_count_of_every_preset(name: str) -> None:
    _check_counts(replace(PRESETS[name], num_layers=2, dropout=0.0, attention_dropout=0.0))


def test_local_layers_are_credited_with_their_band_only() -> None:
    """A window shorter than the sequence (8 over 16 positions, layers 1 and 2 local): the MFU
    count credits each local layer's band, the executed count every key (the dense kernels
    compute the masked scores)."""
    window = LocalAttentionConfig(window=8, global_every=3)
    config = replace(
        PRESETS["modernbert_tiny"],
        num_layers=3,
        local_attention=window,
        dropout=0.0,
        attention_dropout=0.0,
    )
    assert _out_of_band(config) > 0
    _check_counts(config)


def test_modernbert_base_at_8k_is_credited_with_its_windows() -> None:
    """docs/modernbert.md's figure: ModernBERT-base at seq 8,192 (window 128 in two layers of
    three) is credited with 0.565x the FLOPs of the same model with every layer global."""
    model = PRESETS["modernbert_base"]
    common = {"samples": 8, "seq": 8192, "head_tokens": 8 * 8192 * 0.3}
    windowed = step_flops(model, **common)
    everywhere = step_flops(replace(model, local_attention=None), **common)
    assert round(windowed / everywhere, 3) == 0.565


def _check_counts(config) -> None:  # type: ignore[no-untyped-def]
    task = "pretraining" if config.arch == "bert" else "causal_lm"
    measured, labeled, gathered = _counted(config, task)
    if task == "causal_lm":
        labeled = gathered = SAMPLES * SEQ
    padded = padded_vocab_size(config.vocab_size, 1, config.pad_vocab_to)
    common = {"samples": SAMPLES, "seq": SEQ, "task": task}
    executed = executed_flops(config, head_rows=gathered, padded_vocab=padded, **common)
    assert executed == measured
    needed = step_flops(config, head_tokens=labeled, **common)
    h, v = config.hidden_size, config.vocab_size
    head = 2 * (h * h if task == "pretraining" else 0)
    padding = 3 * gathered * 2 * h * (padded - v) + 3 * (gathered - labeled) * (head + 2 * h * v)
    recomputed_scores = 0.5 * SAMPLES * SEQ * 4 * SEQ * h * config.num_layers
    assert executed - needed == padding + recomputed_scores + _out_of_band(config)


def _out_of_band(config) -> float:  # type: ignore[no-untyped-def]
    """What the step computes beyond what the task needs in its local layers: the scores
    outside each window, counted pair by pair (3x a forward)."""
    position = torch.arange(SEQ)
    distance = (position[:, None] - position[None, :]).abs()
    outside = 0
    for layer in range(config.num_layers):
        if (local := config.window_of(layer)) is not None:
            outside += int((distance > local.window // 2).sum())
    return 3.0 * SAMPLES * 4 * config.hidden_size * outside


@pytest.mark.parametrize(
    ("name", "task"),
    [
        ("bert_tiny", "pretraining"),
        ("bert_tiny", "classification"),
        ("gpt2_small", "causal_lm"),
        ("llama_tiny", "causal_lm"),
        ("modernbert_tiny", "pretraining"),
    ],
)
def test_the_meta_count_is_the_cpu_count(name: str, task: str) -> None:
    """The counts above run on meta: the same operators, kernels and FLOPs as a real CPU
    forward and backward of each architecture."""
    config = replace(PRESETS[name], num_layers=2, dropout=0.0, attention_dropout=0.0)
    assert _counted(config, task, "meta") == _counted(config, task, "cpu")


def test_classification_flops_count_the_pooler_and_classifier() -> None:
    config = replace(PRESETS["bert_tiny"], dropout=0.0, attention_dropout=0.0)
    measured, _, _ = _counted(config, "classification")
    padded = padded_vocab_size(config.vocab_size, 1, config.pad_vocab_to)
    common = {"samples": SAMPLES, "seq": SEQ, "task": "classification"}
    assert executed_flops(config, head_rows=0, padded_vocab=padded, **common) == measured


@pytest.mark.parametrize(
    "name", ["bert_base", "gpt2_small", "llama_tiny", "llama3_8b", "modernbert_base"]
)
def test_layer_params_count_a_built_layer(name: str) -> None:
    """Every layer; the first of a pre-norm encoder (ModernBERT) lacks its attention norm."""
    config = replace(PRESETS[name], num_layers=2)
    task = "pretraining" if config.arch == "bert" else "causal_lm"
    model = build_model(config, ParallelContext.single(device="meta"), task=task, initialize=False)
    first, second = (sum(p.numel() for p in b.parameters()) for b in model.blocks())
    assert layer_params(config, 1) == second == first + first_layer_saving(config)


def test_layer_params_count_qwen2s_query_key_value_biases() -> None:
    config = replace(PRESETS["llama_tiny"], num_layers=1, qkv_bias=True)
    model = build_model(config, ParallelContext.single(device="cpu"), task="causal_lm")
    block = next(iter(model.blocks()))
    assert layer_params(config, 1) == sum(p.numel() for p in block.parameters())
    assert layer_params(config, 1) - layer_params(replace(config, qkv_bias=False), 1) == (
        config.hidden_size + 2 * config.kv_heads * config.hidden_size // config.num_heads
    )


@pytest.mark.parametrize("name", ["bert_tiny", "gpt2_small", "llama_tiny", "modernbert_tiny"])
def test_embedding_and_head_params_count_a_built_model(name: str) -> None:
    """Every parameter of a built model (TP=1) is the embedding, the layers or the head."""
    from tpformer.models.costs import embedding_params, head_params

    config = replace(PRESETS[name], num_layers=2)
    task = "pretraining" if config.arch == "bert" else "causal_lm"
    model = build_model(config, ParallelContext.single(device="cpu"), task=task, initialize=False)
    counted = (
        embedding_params(config, 1)
        + config.num_layers * layer_params(config, 1)
        - first_layer_saving(config)
        + head_params(config, 1, nsp=task == "pretraining" and config.pooler == "tanh")
    )
    assert counted == sum(p.numel() for p in model.parameters())  # a tied word embedding once
