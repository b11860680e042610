"""Which examples a DP rank trains on at each step, and how a split is cut for prediction.

Training: step s takes positions [s x B, (s+1) x B) of an endless stream that visits the
training split once per epoch in an order seeded by (seed, epoch) -- never by the layout. With
group_by_length the step's examples are sorted by length before DP rank r takes its contiguous
slice, which it cuts into micro-batches padded to their own longest row. Each micro-batch's
dropout masks are keyed by its first stream slot, so every layout draws the same masks.
"""

from __future__ import annotations

import math

import torch

from tpformer.data.glue.features import collate
from tpformer.data.pretraining import EpochOrder


class GlueTrainSteps:
    """This DP rank's micro-batches of every global step, as (dropout key, batch) pairs."""

    def __init__(self, examples: list[dict], *, batch_size: int, micro_batch_size: int,
                 dp_size: int, dp_rank: int, seed: int, group_by_length: bool, pad_id: int,
                 regression: bool) -> None:
        self.examples, self.batch_size, self.micro = examples, batch_size, micro_batch_size
        self.dp_size, self.dp_rank = dp_size, dp_rank
        self.group_by_length, self.pad_id, self.regression = group_by_length, pad_id, regression
        self.order = EpochOrder(len(examples), seed)
        self.steps_per_epoch = math.ceil(len(examples) / batch_size)

    def _slots(self, step: int) -> list[tuple[int, dict]]:
        """(slot, example) of this rank's slice of global batch `step`; slots are the step's
        stream positions in (length-sorted) batch order."""
        positions = range(step * self.batch_size, (step + 1) * self.batch_size)
        chosen = [(p, self.examples[self.order(p)]) for p in positions]
        if self.group_by_length:
            chosen.sort(key=lambda pe: (len(pe[1]["input_ids"]), pe[0]))
        slots = [(positions[j], e) for j, (_, e) in enumerate(chosen)]
        per_rank = len(slots) // self.dp_size
        return slots[self.dp_rank * per_rank:(self.dp_rank + 1) * per_rank]

    def __call__(self, step: int) -> list[tuple[int, dict[str, torch.Tensor]]]:
        mine = self._slots(step)
        parts = [mine[m:m + self.micro] for m in range(0, len(mine), self.micro)]
        return [(part[0][0], collate([e for _, e in part], self.pad_id, self.regression))
                for part in parts]


def prediction_batches(examples: list[dict], *, micro_batch_size: int, dp_size: int,
                       dp_rank: int, pad_id: int) -> list[dict[str, torch.Tensor]]:
    """This DP rank's contiguous share of a split, cut into unlabeled padded batches."""
    per_rank = math.ceil(len(examples) / dp_size)
    mine = examples[dp_rank * per_rank:(dp_rank + 1) * per_rank]
    batches = []
    for start in range(0, len(mine), micro_batch_size):
        batch = collate(mine[start:start + micro_batch_size], pad_id, False)
        batch.pop("labels", None)
        batches.append(batch)
    return batches
