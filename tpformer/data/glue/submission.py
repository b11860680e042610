"""Test-set predictions in the GLUE benchmark's submission format (index<TAB>prediction); the
user's own task's in the same format, in predictions/test.tsv."""

from __future__ import annotations

from pathlib import Path

import torch

from tpformer.data.glue.tasks import GlueTask

SUBMISSION = {
    "cola": ["CoLA"],
    "sst2": ["SST-2"],
    "mrpc": ["MRPC"],
    "stsb": ["STS-B"],
    "qqp": ["QQP"],
    "mnli": ["MNLI-m", "MNLI-mm"],
    "qnli": ["QNLI"],
    "rte": ["RTE"],
    "wnli": ["WNLI"],
}
"""File names of the GLUE benchmark's submission format, one per test split."""


def submission_name(task: GlueTask, split: str) -> str:
    if task.own:
        return split
    return SUBMISSION[task.name][task.test_splits.index(split)]


def write_submission(path: Path, task: GlueTask, pred: torch.Tensor, index: list[int]) -> None:
    """Class names (or STS-B scores clipped to [0, 5], a regression's as predicted, a
    multi-label row's names joined by commas) per example index."""
    labels = task.labels
    if labels is not None and task.multilabel:
        values = [",".join(labels[i] for i, on in enumerate(p) if on) for p in pred.tolist()]
    elif labels is None and task.own:
        values = [f"{p:.6g}" for p in pred.tolist()]
    elif labels is None:
        values = [f"{min(5.0, max(0.0, p)):.3f}" for p in pred.tolist()]
    else:
        values = [labels[int(p)] for p in pred.tolist()]
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = ["index\tprediction", *(f"{i}\t{v}" for i, v in zip(index, values))]
    path.write_text("\n".join(lines) + "\n")
