"""What a task optimizes: a micro-batch -> its shares of the global-batch means.

Each objective's `counts` are summed on the host over this rank's micro-batches when the step
is prepared (data/steps.py); the step all-reduces them over DP on the device (one small
all-reduce, never read on the host) and passes the global counts back as a float64 tensor, so
every layout -- any DP degree, micro-batch size or accumulation -- optimizes and reports the
same global means. The first value of `__call__` is the loss that is backpropagated; the rest
are metrics.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch
from torch import Tensor, nn

from tpformer.layers.sequence import labeled_positions


def _mean(value: Tensor, count: Tensor) -> Tensor:
    """value / count with the count in the dtype the division computes in (value's, or the
    default float for integer values), as dividing by a host number would."""
    dtype = value.dtype if value.is_floating_point() else torch.get_default_dtype()
    return value / count.to(dtype)


def _share(value: Tensor, part: float, total: Tensor) -> Tensor:
    """value x part / total, the ratio taken in float64 and rounded to value's dtype once, as a
    Python float would be: the same bits as dividing by a host count."""
    return value * (part / total).to(value.dtype)


class Objective(Protocol):
    names: tuple[str, ...]
    """What __call__ returns, in order; names[0] is the loss."""
    head_fraction: float
    """Share of the tokens the output head runs on (for the FLOPs estimate)."""

    def counts(self, batch: dict[str, Tensor]) -> list[float]:
        """This micro-batch's normalizing counts, from its host tensors (summed over the
        global batch by the step)."""
        ...

    def host_inputs(self, batch: dict[str, Tensor]) -> dict[str, Tensor]:
        """The batch with what the step needs computed on the host when the step is prepared
        (data/steps.py), so the step reads nothing back from the device."""
        ...

    def model_inputs(self, batch: dict[str, Tensor]) -> dict[str, Tensor]:
        """The model's keyword arguments for this batch (they include input_ids)."""
        ...

    def values(self, out: Any, batch: dict[str, Tensor], counts: Tensor) -> list[Tensor]:
        """This micro-batch's share of each global-batch mean in `names`, from the model's
        output (computed by the last pipeline stage when there are several)."""
        ...

    def __call__(self, model: nn.Module, batch: dict[str, Tensor], counts: Tensor) -> list[Tensor]:
        """values(model(**model_inputs(batch)), ...)."""
        ...


class _Objective:
    def host_inputs(self, batch: dict[str, Tensor]) -> dict[str, Tensor]:
        return batch

    def model_inputs(self, batch: dict[str, Tensor]) -> dict[str, Tensor]:
        return batch

    def values(self, out: Any, batch: dict[str, Tensor], counts: Tensor) -> list[Tensor]:
        raise NotImplementedError

    def __call__(self, model: nn.Module, batch: dict[str, Tensor], counts: Tensor) -> list[Tensor]:
        inputs = self.model_inputs(batch)
        return self.values(model(**inputs), inputs, counts)


class MaskedLMObjective(_Objective):
    """BERT pretraining: MLM loss over the masked tokens of the global batch plus NSP/SOP loss
    over its samples; MLM accuracy (argmax over the full vocabulary) and NSP/SOP accuracy."""

    names: tuple[str, ...] = ("loss", "mlm_loss", "nsp_loss", "mlm_accuracy", "nsp_accuracy")

    def __init__(self, mask_prob: float, *, pair_head: bool = True) -> None:
        self.head_fraction, self.pair_head = mask_prob, pair_head
        if not pair_head:  # MLM only (model.pooler=head: ModernBERT's recipe)
            self.names = ("loss", "mlm_accuracy")

    def counts(self, batch: dict[str, Tensor]) -> list[float]:
        return [float(int((batch["mlm_labels"] != -100).sum())), float(batch["input_ids"].shape[0])]

    def host_inputs(self, batch: dict[str, Tensor]) -> dict[str, Tensor]:
        """Adds the labeled positions the MLM head gathers (no nonzero on the device)."""
        return {**batch, "mlm_positions": labeled_positions(batch["mlm_labels"])}

    def values(self, out: Any, batch: dict[str, Tensor], counts: Tensor) -> list[Tensor]:
        masked, samples = counts[0], counts[1]
        mlm = _mean(out.mlm_loss_sum, masked)
        if not self.pair_head:
            return [mlm, _mean(out.mlm_correct, masked)]
        nsp = _mean(out.nsp_loss * batch["input_ids"].shape[0], samples)
        return [
            mlm + nsp,
            mlm,
            nsp,
            _mean(out.mlm_correct, masked),
            _mean(out.nsp_correct, samples),
        ]


class CausalLMObjective(_Objective):
    """GPT pretraining: next-token loss over every predicted token of the global batch. Packed
    documents (`position_ids`, data.pack): a document's first token is not a target of the
    token before it (the previous document's last)."""

    names: tuple[str, ...] = ("loss",)
    head_fraction = 1.0

    def counts(self, batch: dict[str, Tensor]) -> list[float]:
        ids = batch["input_ids"]
        if "labels" in batch:
            return [float(int((batch["labels"][:, 1:] != -100).sum()))]
        return [float(ids.shape[0] * (ids.shape[1] - 1))]

    def host_inputs(self, batch: dict[str, Tensor]) -> dict[str, Tensor]:
        """Packed documents: the labels, with every document start ignored, made on the host."""
        if "position_ids" not in batch:
            return batch
        starts = batch["position_ids"] == 0
        return {**batch, "labels": batch["input_ids"].masked_fill(starts, -100)}

    def model_inputs(self, batch: dict[str, Tensor]) -> dict[str, Tensor]:
        inputs = {
            "input_ids": batch["input_ids"],
            "labels": batch.get("labels", batch["input_ids"]),
        }
        if "position_ids" in batch:
            inputs["position_ids"] = batch["position_ids"]
        return inputs

    def values(self, out: Any, batch: dict[str, Tensor], counts: Tensor) -> list[Tensor]:
        return [_mean(out.loss_sum, counts[0])]


class ClassificationObjective(_Objective):
    """Sequence classification (cross-entropy) or regression (MSE), mean over the examples."""

    names: tuple[str, ...] = ("loss",)
    head_fraction = 0.0

    def counts(self, batch: dict[str, Tensor]) -> list[float]:
        return [float(batch["input_ids"].shape[0])]

    def values(self, out: Any, batch: dict[str, Tensor], counts: Tensor) -> list[Tensor]:
        return [_share(out.loss, batch["input_ids"].shape[0], counts[0])]


def objective_for(task: str, *, mask_prob: float = 0.15, pair_head: bool = True) -> Objective:
    """The objective of a model task ("pretraining", "causal_lm" or "classification");
    `pair_head`: BERT pretraining's NSP/SOP loss (false: MLM only)."""
    if task == "pretraining":
        return MaskedLMObjective(mask_prob, pair_head=pair_head)
    return CausalLMObjective() if task == "causal_lm" else ClassificationObjective()


__all__ = [
    "CausalLMObjective",
    "ClassificationObjective",
    "MaskedLMObjective",
    "Objective",
    "objective_for",
]
