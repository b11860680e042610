"""What a task optimizes: a micro-batch -> its shares of the global-batch means.

The loop sums each objective's `counts` over this rank's micro-batches, all-reduces them over DP
(one small all-reduce) and passes the global counts back, so every layout -- any DP degree,
micro-batch size or accumulation -- optimizes and reports the same global means. The first
value of `__call__` is the loss that is backpropagated; the rest are metrics.
"""

from __future__ import annotations

from typing import Any, Protocol

from torch import Tensor, nn


class Objective(Protocol):
    names: tuple[str, ...]
    """What __call__ returns, in order; names[0] is the loss."""
    head_fraction: float
    """Share of the tokens the output head runs on (for the FLOPs estimate)."""

    def counts(self, batch: dict[str, Tensor]) -> list[float]:
        """This micro-batch's normalizing counts (summed over the global batch by the loop)."""
        ...

    def model_inputs(self, batch: dict[str, Tensor]) -> dict[str, Tensor]:
        """The model's keyword arguments for this batch (they include input_ids)."""
        ...

    def values(self, out: Any, batch: dict[str, Tensor], counts: list[float]) -> list[Tensor]:
        """This micro-batch's share of each global-batch mean in `names`, from the model's
        output (computed by the last pipeline stage when there are several)."""
        ...

    def __call__(
        self, model: nn.Module, batch: dict[str, Tensor], counts: list[float]
    ) -> list[Tensor]:
        """values(model(**model_inputs(batch)), ...)."""
        ...


class _Objective:
    def model_inputs(self, batch: dict[str, Tensor]) -> dict[str, Tensor]:
        return batch

    def values(self, out: Any, batch: dict[str, Tensor], counts: list[float]) -> list[Tensor]:
        raise NotImplementedError

    def __call__(
        self, model: nn.Module, batch: dict[str, Tensor], counts: list[float]
    ) -> list[Tensor]:
        inputs = self.model_inputs(batch)
        return self.values(model(**inputs), inputs, counts)


class MaskedLMObjective(_Objective):
    """BERT pretraining: MLM loss over the masked tokens of the global batch plus NSP/SOP loss
    over its samples; MLM accuracy (argmax over the full vocabulary) and NSP/SOP accuracy."""

    names: tuple[str, ...] = ("loss", "mlm_loss", "nsp_loss", "mlm_accuracy", "nsp_accuracy")

    def __init__(self, mask_prob: float) -> None:
        self.head_fraction = mask_prob

    def counts(self, batch: dict[str, Tensor]) -> list[float]:
        return [float(int((batch["mlm_labels"] != -100).sum())), float(batch["input_ids"].shape[0])]

    def values(self, out: Any, batch: dict[str, Tensor], counts: list[float]) -> list[Tensor]:
        masked, samples = counts
        mlm = out.mlm_loss_sum / masked
        nsp = out.nsp_loss * batch["input_ids"].shape[0] / samples
        return [mlm + nsp, mlm, nsp, out.mlm_correct / masked, out.nsp_correct / samples]


class CausalLMObjective(_Objective):
    """GPT pretraining: next-token loss over every predicted token of the global batch."""

    names: tuple[str, ...] = ("loss",)
    head_fraction = 1.0

    def counts(self, batch: dict[str, Tensor]) -> list[float]:
        ids = batch["input_ids"]
        return [float(ids.shape[0] * (ids.shape[1] - 1))]

    def model_inputs(self, batch: dict[str, Tensor]) -> dict[str, Tensor]:
        return {"input_ids": batch["input_ids"], "labels": batch["input_ids"]}

    def values(self, out: Any, batch: dict[str, Tensor], counts: list[float]) -> list[Tensor]:
        tokens = batch["input_ids"].shape[0] * (batch["input_ids"].shape[1] - 1)
        return [out.loss * (tokens / counts[0])]


class ClassificationObjective(_Objective):
    """Sequence classification (cross-entropy) or regression (MSE), mean over the examples."""

    names: tuple[str, ...] = ("loss",)
    head_fraction = 0.0

    def counts(self, batch: dict[str, Tensor]) -> list[float]:
        return [float(batch["input_ids"].shape[0])]

    def values(self, out: Any, batch: dict[str, Tensor], counts: list[float]) -> list[Tensor]:
        return [out.loss * (batch["input_ids"].shape[0] / counts[0])]


def objective_for(task: str, *, mask_prob: float = 0.15) -> Objective:
    """The objective of a model task ("pretraining", "causal_lm" or "classification")."""
    if task == "pretraining":
        return MaskedLMObjective(mask_prob)
    return CausalLMObjective() if task == "causal_lm" else ClassificationObjective()


__all__ = [
    "CausalLMObjective",
    "ClassificationObjective",
    "MaskedLMObjective",
    "Objective",
    "objective_for",
]
