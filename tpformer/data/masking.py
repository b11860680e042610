"""BERT's masked-LM corruption: choose round(mask_prob x maskable tokens) positions (whole words
optionally; at most max_predictions), replace 80% with [MASK], 10% with a random token, keep
10%; specials are never chosen, nor drawn as the random token."""

from __future__ import annotations

import torch
from torch import Tensor

IGNORE = -100


def mask_tokens(
    ids: Tensor,
    maskable: Tensor,
    *,
    word_start: Tensor,
    mask_id: int,
    random_ids: Tensor,
    mask_prob: float,
    whole_word: bool,
    generator: torch.Generator,
    max_predictions: int = 0,
) -> tuple[Tensor, Tensor]:
    """(inputs, labels) for one sequence; labels are IGNORE except at chosen positions, at most
    `max_predictions` of them when it is set (Google's max_predictions_per_seq)."""
    positions = maskable.nonzero().flatten()
    budget = max(1, round(mask_prob * positions.numel())) if positions.numel() else 0
    if max_predictions:
        budget = min(budget, max_predictions)
    if whole_word:  # a word = a word-start token and the continuation tokens after it
        starts = word_start[ids[positions]] | (
            positions != torch.cat([positions[:1] - 1, positions[:-1]]) + 1
        )
        word_of = torch.cumsum(starts.long(), 0) - 1
        order = torch.randperm(int(starts.sum()), generator=generator)
        chosen = torch.zeros(positions.numel(), dtype=torch.bool)
        count = 0
        for word in order.tolist():
            members = word_of == word
            size = int(members.sum())
            if count + size > budget:
                continue
            chosen |= members
            count += size
            if count == budget:
                break
        picked = positions[chosen]
    else:
        picked = positions[torch.randperm(positions.numel(), generator=generator)[:budget]]
    labels = torch.full_like(ids, IGNORE)
    labels[picked] = ids[picked]
    inputs = ids.clone()
    action = torch.rand(picked.numel(), generator=generator)
    inputs[picked[action < 0.8]] = mask_id
    swap = picked[(action >= 0.8) & (action < 0.9)]
    inputs[swap] = random_ids[
        torch.randint(0, random_ids.numel(), (swap.numel(),), generator=generator)
    ]
    return inputs, labels
