"""Which examples a DP rank trains on at each step, and how a split is cut for prediction.

Training: every epoch is cut into ceil(N / B) global batches of B examples, a pure function of
(seed, epoch) -- never of the layout -- so every TP/DP/accumulation layout trains on the same
batches. With group_by_length (transformers' LengthGroupedSampler, made layout-free): shuffle,
cut into mega-batches of up to 50 batches, sort each by length (longest first), cut into batches,
shuffle the batch order and put the batch holding the longest example first (an out-of-memory
shows at once). Without it, plain shuffled batches. The last batch of an epoch is filled up with
the epoch's first examples (as DistributedSampler pads), so every step has B examples. Within a
batch the examples are sorted by length before DP rank r takes its contiguous slice and cuts
it into micro-batches padded to their own longest row; each micro-batch's dropout masks are
keyed by its first position in the global stream (step x B + index in the batch), attention's
drawn at the step's widest micro-batch, so they do not depend on the micro-batch's padding.

Prediction: the split sorted by length, cut into batches of a fixed token budget, predictions
put back in the split's order.
"""

from __future__ import annotations

import math

import torch

from tpformer.data.glue.features import collate
from tpformer.parallel.random import derive_seed

_BATCHES = 0x6B47
MEGA_BATCHES = 50
"""Batches per mega-batch, as transformers' LengthGroupedSampler (fewer on a small split)."""


def epoch_batches(
    lengths: list[int], batch_size: int, *, seed: int, epoch: int, group_by_length: bool
) -> list[list[int]]:
    """Example indices of each global batch of `epoch` (see the module docstring)."""
    n, size = len(lengths), batch_size
    g = torch.Generator().manual_seed(derive_seed(seed, epoch, _BATCHES))
    order = torch.randperm(n, generator=g).tolist()
    if group_by_length:
        mega = max(1, min(n // (4 * size), MEGA_BATCHES)) * size
        order = [
            i
            for k in range(0, n, mega)
            for i in sorted(order[k : k + mega], key=lambda i: -lengths[i])
        ]
    order += [order[i % n] for i in range(-n % size)]  # fill the last batch
    batches = [order[k : k + size] for k in range(0, len(order), size)]
    if group_by_length:
        batches = [batches[i] for i in torch.randperm(len(batches), generator=g).tolist()]
        longest = max(range(len(batches)), key=lambda k: max(lengths[i] for i in batches[k]))
        batches.insert(0, batches.pop(longest))
    return batches


class GlueTrainSteps:
    """This DP rank's micro-batches of every global step, as (dropout key, batch) pairs."""

    def __init__(
        self,
        examples: list[dict],
        *,
        batch_size: int,
        micro_batch_size: int,
        dp_size: int,
        dp_rank: int,
        seed: int,
        group_by_length: bool,
        pad_id: int,
        float_labels: bool,
        pad_multiple: int = 1,
    ) -> None:
        self.examples, self.batch_size, self.micro = examples, batch_size, micro_batch_size
        self.dp_size, self.dp_rank, self.seed = dp_size, dp_rank, seed
        self.group_by_length, self.pad_id = group_by_length, pad_id
        self.float_labels = float_labels
        self.pad_multiple = pad_multiple
        self.lengths = [len(e["input_ids"]) for e in examples]
        self.steps_per_epoch = math.ceil(len(examples) / batch_size)
        self._epoch = -1
        self._batches: list[list[int]] = []

    def global_batch(self, step: int) -> list[int]:
        """Example indices of global step `step`, sorted by length (the same at every layout)."""
        epoch, k = divmod(step, self.steps_per_epoch)
        if epoch != self._epoch:
            self._epoch = epoch
            self._batches = epoch_batches(
                self.lengths,
                self.batch_size,
                seed=self.seed,
                epoch=epoch,
                group_by_length=self.group_by_length,
            )
        return sorted(self._batches[k], key=lambda i: self.lengths[i])

    def mask_width(self, step: int) -> int:
        """The step's widest micro-batch over every DP rank, from the lengths alone: its
        longest example, padded as collate pads."""
        width = max(self.lengths[i] for i in self.global_batch(step))
        return width + -width % self.pad_multiple

    def __call__(self, step: int) -> list[tuple[int, dict[str, torch.Tensor]]]:
        per_rank = self.batch_size // self.dp_size
        first = self.dp_rank * per_rank
        mine = self.global_batch(step)[first : first + per_rank]
        slot = step * self.batch_size + first
        return [
            (
                slot + m,
                collate(
                    [self.examples[i] for i in mine[m : m + self.micro]],
                    self.pad_id,
                    self.float_labels,
                    self.pad_multiple,
                ),
            )
            for m in range(0, len(mine), self.micro)
        ]


def prediction_order(
    examples: list[dict], *, token_budget: int, dp_size: int, dp_rank: int
) -> list[list[int]]:
    """This DP rank's batches of a split for prediction: the split sorted by length, the rank's
    contiguous share, cut into batches of at most `token_budget` padded tokens."""
    order = sorted(range(len(examples)), key=lambda i: len(examples[i]["input_ids"]))
    per_rank = math.ceil(len(order) / dp_size)
    mine = order[dp_rank * per_rank : (dp_rank + 1) * per_rank]
    batches: list[list[int]] = []
    for i in mine:  # ascending lengths: the newest row is the batch's longest
        width = len(examples[i]["input_ids"])
        if batches and (len(batches[-1]) + 1) * width <= token_budget:
            batches[-1].append(i)
        else:
            batches.append([i])
    return batches


def prediction_batch(
    examples: list[dict], indices: list[int], pad_id: int, pad_multiple: int = 1
) -> dict[str, torch.Tensor]:
    """The unlabeled, padded batch of the given examples."""
    batch = collate([examples[i] for i in indices], pad_id, False, pad_multiple)
    batch.pop("labels", None)
    return batch
