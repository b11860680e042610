"""Tiny model configs and batches shared by the model tests (made here, nothing downloaded)."""

from __future__ import annotations

import torch
from torch import nn

from tests.tolerances import seeded
from tpformer.config.presets import preset
from tpformer.config.schema import LocalAttentionConfig, ModelConfig
from tpformer.parallel.context import ParallelContext
from tpformer.parallel.init import gather_full

BATCH, SEQ = 4, 12


def tiny_bert(dropout: float = 0.0, **overrides: object) -> ModelConfig:
    """4 heads so tp=4 still has one whole head per rank; vocab 99 exercises padding."""
    fields = {
        "vocab_size": 99,
        "hidden_size": 32,
        "num_heads": 4,
        "intermediate_size": 64,
        "max_position_embeddings": 32,
        "dropout": dropout,
        "attention_dropout": dropout,
        "pad_vocab_to": 8,
    }
    return preset("bert_tiny", **{**fields, **overrides})


def tiny_gpt(dropout: float = 0.0, **overrides: object) -> ModelConfig:
    return preset(
        "gpt2_small",
        **overrides,
        vocab_size=99,
        hidden_size=32,
        num_heads=4,
        num_layers=2,
        intermediate_size=64,
        max_position_embeddings=32,
        dropout=dropout,
        attention_dropout=dropout,
        pad_vocab_to=8,
    )


def tiny_llama(dropout: float = 0.0, kv_heads: int = 4, **overrides: object) -> ModelConfig:
    """Llama's options (rotary positions, RMSNorm, SwiGLU, no biases, an untied head) with 8
    heads in 4 key/value groups, so TP=4 holds one group per rank (fewer key/value heads than
    ranks: each rank holds them all, layers/grouped_qkv.py); dropout, which Llama does not use,
    is there to check its masks under the new blocks too."""
    return preset(
        "llama_tiny",
        **overrides,
        vocab_size=99,
        hidden_size=32,
        num_heads=8,
        num_kv_heads=kv_heads,
        num_layers=2,
        intermediate_size=48,
        max_position_embeddings=32,
        dropout=dropout,
        attention_dropout=dropout,
        pad_vocab_to=8,
    )


def tiny_modernbert(dropout: float = 0.0, **overrides: object) -> ModelConfig:
    """ModernBERT's options (pre-norm without biases, GeGLU, rotary positions with two bases,
    no segments, the pooled head) with 4 layers: 0 and 3 global, 1 and 2 in a window of 4 (2
    positions either side of the 12), so the window shapes every row; dropout, which ModernBERT
    does not use, checks its masks under these blocks too."""
    fields = {
        "vocab_size": 99,
        "hidden_size": 32,
        "num_heads": 4,
        "intermediate_size": 48,
        "max_position_embeddings": 32,
        "local_attention": LocalAttentionConfig(window=4, global_every=3),
        "dropout": dropout,
        "attention_dropout": dropout,
        "pad_vocab_to": 8,
    }
    return preset("modernbert_tiny", **{**fields, **overrides})


def bert_batch(vocab: int = 99) -> dict[str, torch.Tensor]:
    ids = torch.randint(5, vocab, (BATCH, SEQ), generator=seeded(10))
    attention_mask = torch.ones(BATCH, SEQ, dtype=torch.long)
    attention_mask[1, 9:] = 0
    token_type_ids = torch.zeros(BATCH, SEQ, dtype=torch.long)
    token_type_ids[:, 6:] = 1
    mlm_labels = torch.full((BATCH, SEQ), -100)
    chosen = torch.rand(BATCH, SEQ, generator=seeded(11)) < 0.3
    chosen[:, 0] = True
    mlm_labels[chosen] = ids[chosen]
    return {
        "input_ids": ids,
        "token_type_ids": token_type_ids,
        "attention_mask": attention_mask,
        "mlm_labels": mlm_labels,
        "nsp_labels": torch.tensor([0, 1, 1, 0]),
    }


def full_grads(model: nn.Module, ctx: ParallelContext) -> dict[str, torch.Tensor]:
    """Every parameter's gradient, gathered to its full logical shape."""
    return {name: gather_full(p, ctx.tp, p.grad).clone() for name, p in model.named_parameters()}
