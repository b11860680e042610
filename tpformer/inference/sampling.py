"""Choosing the next token from full-vocabulary logits: greedy, or sampling with temperature,
top-k and top-p (in that order, as transformers' logits warpers apply them). Every TP rank holds
the same gathered logits and the same seeded generator, so every rank picks the same token."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class Sampling:
    greedy: bool = True
    temperature: float = 1.0
    top_k: int = 0
    """Keep the k most likely tokens (0: all)."""
    top_p: float = 1.0
    """Keep the most likely tokens whose probabilities sum to at least top_p (1: all)."""


def filtered_logits(logits: Tensor, sampling: Sampling) -> Tensor:
    """Logits [b, vocab] after temperature, top-k and top-p (removed tokens at -inf)."""
    logits = logits.float() / sampling.temperature
    if 0 < sampling.top_k < logits.shape[-1]:
        kth = torch.topk(logits, sampling.top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if sampling.top_p < 1.0:
        ordered, order = torch.sort(logits, dim=-1, descending=True)
        probs = torch.softmax(ordered, dim=-1)
        before = probs.cumsum(-1) - probs  # the mass of the more likely tokens
        drop = before >= sampling.top_p  # never the first: it has nothing before it
        logits = logits.scatter(-1, order, ordered.masked_fill(drop, float("-inf")))
    return logits


def next_tokens(logits: Tensor, sampling: Sampling, generator: torch.Generator) -> Tensor:
    """One token per row of logits [b, vocab] -> [b] (int64)."""
    if sampling.greedy:
        return logits.argmax(-1)
    probs = torch.softmax(filtered_logits(logits, sampling), dim=-1)
    return torch.multinomial(probs, 1, generator=generator)[:, 0]
