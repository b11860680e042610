"""Length-grouped training batches: a function of (seed, epoch) only, every example once per
epoch, little padding; prediction batches restore the split's order."""

from __future__ import annotations

import random

import pytest

from tpformer.data.glue.batches import GlueTrainSteps, epoch_batches, prediction_order


def _examples(n: int, seed: int = 0, lo: int = 5, hi: int = 120) -> list[dict]:
    """A wide length spread, as sentence pairs of a real task have."""
    rng = random.Random(seed)
    return [
        {"input_ids": [1] * rng.randint(lo, hi), "token_type_ids": [0], "index": i, "label": i % 2}
        for i in range(n)
    ]


@pytest.mark.parametrize("group", [True, False])
def test_every_example_once_per_epoch_and_full_batches(group: bool) -> None:
    lengths = [len(e["input_ids"]) for e in _examples(1000)]
    for epoch in range(3):
        batches = epoch_batches(lengths, 32, seed=7, epoch=epoch, group_by_length=group)
        assert all(len(b) == 32 for b in batches) and len(batches) == 32  # ceil(1000 / 32)
        seen = [i for b in batches for i in b]
        assert set(seen) == set(range(1000)) and len(seen) - 1000 == 24  # the fill
    if group:  # the longest example comes first, so an out-of-memory shows at once
        assert max(lengths[i] for i in batches[0]) == max(lengths)


@pytest.mark.parametrize(("dp", "micro"), [(1, 32), (2, 16), (4, 4), (2, 2)])
def test_the_global_batches_do_not_depend_on_the_layout(dp: int, micro: int) -> None:
    """What the DP ranks of a step take together, micro-batch by micro-batch, in order, is the
    one-process run's global batch, and the dropout keys are its positions."""
    examples = _examples(300)
    one = GlueTrainSteps(
        examples,
        batch_size=32,
        micro_batch_size=32,
        dp_size=1,
        dp_rank=0,
        seed=3,
        group_by_length=True,
        pad_id=0,
        float_labels=False,
    )
    ranks = [
        GlueTrainSteps(
            examples,
            batch_size=32,
            micro_batch_size=micro,
            dp_size=dp,
            dp_rank=r,
            seed=3,
            group_by_length=True,
            pad_id=0,
            float_labels=False,
        )
        for r in range(dp)
    ]
    for step in range(25):  # across epoch boundaries (10 steps per epoch)
        want = one.global_batch(step)
        assert [r.global_batch(step) for r in ranks] == [want] * dp
        keys = [
            key
            for r in ranks
            for key, batch in r(step)
            for key in range(key, key + batch["input_ids"].shape[0])
        ]
        assert keys == list(range(step * 32, (step + 1) * 32))
        rows = sorted(
            int(b["attention_mask"].sum(1)[j])
            for r in ranks
            for _, b in r(step)
            for j in range(b["input_ids"].shape[0])
        )
        assert rows == sorted(len(examples[i]["input_ids"]) for i in want)


def _padded_tokens(group: bool, examples: list[dict]) -> tuple[int, int]:
    steps = GlueTrainSteps(
        examples,
        batch_size=32,
        micro_batch_size=32,
        dp_size=1,
        dp_rank=0,
        seed=1,
        group_by_length=group,
        pad_id=0,
        float_labels=False,
    )
    batches = [steps(s)[0][1] for s in range(steps.steps_per_epoch)]
    return (
        sum(b["input_ids"].numel() for b in batches),
        sum(int(b["attention_mask"].sum()) for b in batches),
    )


def test_grouping_pads_at_most_a_fifth() -> None:
    """Lengths 5-120 tokens, batch 32: grouped, the padded tokens of an epoch are at most 1.2x
    the real ones; shuffled, about 1.8x."""
    examples = _examples(4000)
    padded, real = _padded_tokens(True, examples)
    assert padded <= 1.2 * real, padded / real
    shuffled, real_shuffled = _padded_tokens(False, examples)
    assert shuffled > 1.5 * real_shuffled


def test_prediction_batches_cover_the_split_in_length_order() -> None:
    examples = _examples(101)
    for dp in (1, 2, 4):
        parts = [
            prediction_order(examples, token_budget=512, dp_size=dp, dp_rank=r) for r in range(dp)
        ]
        flat = [i for part in parts for batch in part for i in batch]
        assert sorted(flat) == list(range(101))
        lengths = [len(examples[i]["input_ids"]) for i in flat]
        assert lengths == sorted(lengths)
        assert all(
            len(b) * len(examples[b[-1]]["input_ids"]) <= 512 or len(b) == 1
            for part in parts
            for b in part
        )


@pytest.mark.parametrize(("dp", "micro", "multiple"), [(1, 8, 1), (2, 4, 1), (4, 2, 8)])
def test_mask_width_is_the_widest_micro_batch_of_every_rank(
    dp: int, micro: int, multiple: int
) -> None:
    """Computed on the host from the lengths alone, it equals what all-reducing the ranks'
    batch widths gave (the step's widest micro-batch, padded as collate pads)."""
    examples = _examples(200)
    ranks = [
        GlueTrainSteps(
            examples,
            batch_size=16,
            micro_batch_size=micro,
            dp_size=dp,
            dp_rank=r,
            seed=5,
            group_by_length=False,
            pad_id=0,
            float_labels=False,
            pad_multiple=multiple,
        )
        for r in range(dp)
    ]
    for step in range(20):
        widest = max(b["input_ids"].shape[1] for steps in ranks for _, b in steps(step))
        assert all(steps.mask_width(step) == widest for steps in ranks), step
