"""Test-set predictions in the GLUE benchmark's submission format (index<TAB>prediction)."""

from __future__ import annotations

from pathlib import Path

import torch

from tpformer.data.glue.tasks import get_task

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


def submission_name(task_name: str, split: str) -> str:
    return SUBMISSION[task_name][get_task(task_name).test_splits.index(split)]


def write_submission(path: Path, task_name: str, pred: torch.Tensor, index: list[int]) -> None:
    """Class names (or STS-B scores clipped to [0, 5]) per example index."""
    labels = get_task(task_name).labels
    if labels is None:
        values = [f"{min(5.0, max(0.0, p)):.3f}" for p in pred.tolist()]
    else:
        values = [labels[int(p)] for p in pred.tolist()]
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = ["index\tprediction", *(f"{i}\t{v}" for i, v in zip(index, values))]
    path.write_text("\n".join(lines) + "\n")
