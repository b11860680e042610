"""Config values derived at the layout a run finds (the validator only checks; this sets)."""

from __future__ import annotations

from tpformer.config.schema import (
    DataConfig,
    FinetuneTrainerConfig,
    ModelConfig,
    Pooler,
    SentencePairs,
    TrainerConfig,
)
from tpformer.parallel.layout import divisors


def apply_global_batch(trainer: TrainerConfig, dp: int) -> None:
    """trainer.global_batch_size -> trainer.grad_accum for this world's DP degree (the one place
    it is derived; every reader of grad_accum then sees the derived value)."""
    total, micro = trainer.global_batch_size, trainer.micro_batch_size
    if total == 0:
        return
    if total % (micro * dp):
        per_rank = total // dp if total % dp == 0 else 0
        valid = (
            f"trainer.micro_batch_size in {divisors(per_rank)}"
            if per_rank
            else f"a trainer.global_batch_size that is a multiple of dp={dp}"
        )
        raise ValueError(
            f"trainer.global_batch_size={total} is not a multiple of trainer.micro_batch_size="
            f"{micro} x dp={dp} = {micro * dp}; valid at this layout: {valid}"
        )
    trainer.grad_accum = total // (micro * dp)


def pair_recipe(model: ModelConfig, data: DataConfig) -> SentencePairs:
    """data.sentence_pairs, with auto resolved to the model's recipe: none for a pooler=head
    encoder (ModernBERT trains MLM only: it has no pair head), nsp otherwise."""
    if data.sentence_pairs != SentencePairs.auto:
        return data.sentence_pairs
    return SentencePairs.none if model.pooler == Pooler.head else SentencePairs.nsp


def apply_pair_recipe(model: ModelConfig, data: DataConfig) -> None:
    """data.sentence_pairs=auto -> the model's recipe (pair_recipe), set once for every reader."""
    data.sentence_pairs = pair_recipe(model, data)


def finetune_micro_batching(trainer: FinetuneTrainerConfig, dp: int) -> tuple[int, int]:
    """(micro-batch, micro-batches per step) of a fine-tuning job on `dp` DP ranks:
    trainer.micro_batch_size, by default the DP rank's whole share of trainer.batch_size."""
    micro = trainer.micro_batch_size or trainer.batch_size // dp
    return micro, trainer.batch_size // (micro * dp)


def mlm_fraction(data: DataConfig) -> float:
    """The share of a BERT sample's tokens the MLM head predicts: data.mask_prob, or less where
    data.max_predictions_per_seq caps it (what the planner and the FLOPs estimate price)."""
    cap = data.max_predictions_per_seq
    return min(data.mask_prob, cap / max(1, data.seq_length - 3)) if cap else data.mask_prob
