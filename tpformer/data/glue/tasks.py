"""GLUE tasks: the original directory layout (<TASK>/train.tsv, dev.tsv, test.tsv with each task's
own columns and header conventions) read through `datasets`, labels mapped to ids, and the
official metrics (scikit-learn's and SciPy's). The fine-tuning loop builds on this; a task on
the user's own files (own.py) is a GlueTask too.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from tpformer.progress import quiet_datasets_off_a_terminal


@dataclass(frozen=True)
class GlueTask:
    """Where a task's columns are, what its labels are and how it is scored."""

    directory: str
    text_a: str
    text_b: str | None
    label: str
    labels: tuple[str, ...] | None
    """The label strings in id order; None for regression (STS-B)."""
    metrics: tuple[str, ...]
    dev_splits: tuple[str, ...] = ("dev",)
    test_splits: tuple[str, ...] = ("test",)
    columns: tuple[str, ...] | None = None
    """Column names of a file without a header row (CoLA's train/dev)."""
    name: str = ""
    """task=...: a GLUE task's name, or classification / regression / multilabel."""
    own: bool = False
    """A task on the user's own files: text_a, text_b and label name their columns."""
    multilabel: bool = False
    """Each example holds any subset of the labels (a multi-hot row, binary cross-entropy)."""

    @property
    def num_labels(self) -> int:
        return 1 if self.labels is None else len(self.labels)

    @property
    def float_labels(self) -> bool:
        """Regression scores or multi-hot rows (else class ids)."""
        return self.labels is None or self.multilabel

    def file_columns(self) -> tuple[str, str | None, str]:
        """The text, pair and label columns of a data.*_file: the hub's names for a GLUE task
        (its TSVs name them otherwise), the given ones for the user's own task."""
        if self.own:
            return self.text_a, self.text_b, self.label
        a, b = HUB_TEXT.get(self.name, ("sentence1", "sentence2"))
        return a, b, "label"


_GLUE: dict[str, GlueTask] = {
    "cola": GlueTask(
        "CoLA",
        "sentence",
        None,
        "label",
        ("0", "1"),
        ("mcc",),
        columns=("source", "label", "original", "sentence"),
    ),
    "sst2": GlueTask("SST-2", "sentence", None, "label", ("0", "1"), ("accuracy",)),
    "mrpc": GlueTask("MRPC", "#1 String", "#2 String", "Quality", ("0", "1"), ("accuracy", "f1")),
    "stsb": GlueTask("STS-B", "sentence1", "sentence2", "score", None, ("pearson", "spearman")),
    "qqp": GlueTask(
        "QQP", "question1", "question2", "is_duplicate", ("0", "1"), ("accuracy", "f1")
    ),
    "mnli": GlueTask(
        "MNLI",
        "sentence1",
        "sentence2",
        "gold_label",
        ("contradiction", "entailment", "neutral"),
        ("accuracy",),
        dev_splits=("dev_matched", "dev_mismatched"),
        test_splits=("test_matched", "test_mismatched"),
    ),
    "qnli": GlueTask(
        "QNLI", "question", "sentence", "label", ("entailment", "not_entailment"), ("accuracy",)
    ),
    "rte": GlueTask(
        "RTE", "sentence1", "sentence2", "label", ("entailment", "not_entailment"), ("accuracy",)
    ),
    "wnli": GlueTask("WNLI", "sentence1", "sentence2", "label", ("0", "1"), ("accuracy",)),
}
TASKS: dict[str, GlueTask] = {name: replace(task, name=name) for name, task in _GLUE.items()}


def get_task(name: str) -> GlueTask:
    if name not in TASKS:
        raise ValueError(f"task={name!r} is not a GLUE task; use one of {sorted(TASKS)}")
    return TASKS[name]


def split_file(glue_dir: str | Path, task_name: str, split: str) -> Path:
    """glue_dir/<TASK>/<split>.tsv, or FileNotFoundError naming it and the layout expected."""
    task = get_task(task_name)
    path = Path(glue_dir).expanduser() / task.directory / f"{split}.tsv"
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} is missing: data.glue_dir must hold the GLUE layout "
            f"<TASK>/{{train,{','.join(task.dev_splits)}}}.tsv for task={task_name}"
        )
    return path


def read_split(glue_dir: Path, task_name: str, split: str) -> dict[str, Any]:
    """{"text_a", "text_b", "label", "index"} of one split; labels are ids (or floats for STS-B)
    and are absent from test splits. Errors name the file and the column."""
    import datasets

    quiet_datasets_off_a_terminal()

    task = get_task(task_name)
    path = split_file(glue_dir, task_name, split)
    headerless = task.columns is not None and not split.startswith("test")
    options: dict[str, Any] = (
        {"column_names": list(task.columns or ()), "header": None} if headerless else {}
    )
    table = datasets.load_dataset(
        "csv",
        data_files=str(path),
        delimiter="\t",
        quoting=csv.QUOTE_NONE,
        keep_default_na=False,
        split="train",
        **options,
    )
    wanted = [task.text_a, *([task.text_b] if task.text_b else [])]
    if not split.startswith("test"):
        wanted.append(task.label)
    missing = [c for c in wanted if c not in table.column_names]
    if missing:
        raise ValueError(f"{path} has no column {missing[0]!r} (columns: {table.column_names})")
    rows = {
        "text_a": [str(x) for x in table[task.text_a]],
        "text_b": [str(x) for x in table[task.text_b]] if task.text_b else None,
        "index": list(range(len(table))),
    }
    if not split.startswith("test"):
        rows["label"] = _label_ids(task, [str(x) for x in table[task.label]], path)
    return rows


HUB = "nyu-mll/glue"
HUB_TEXT = {
    "cola": ("sentence", None),
    "sst2": ("sentence", None),
    "qqp": ("question1", "question2"),
    "mnli": ("premise", "hypothesis"),
    "qnli": ("question", "sentence"),
}


def read_hub_split(task_name: str, split: str) -> dict[str, Any]:
    """The same rows from the hub dataset (needs network): dev -> validation, labels mapped by
    name where the hub orders them differently (MNLI)."""
    import datasets

    quiet_datasets_off_a_terminal()

    task = get_task(task_name)
    table = datasets.load_dataset(HUB, task_name, split=split.replace("dev", "validation"))
    a, b = HUB_TEXT.get(task_name, ("sentence1", "sentence2"))
    rows = {
        "text_a": list(table[a]),
        "text_b": list(table[b]) if b else None,
        "index": list(table["idx"]),
    }
    if not split.startswith("test"):
        labels = table["label"]
        if task.labels is not None and task.labels[0] not in ("0", "1"):
            names = table.features["label"].names
            labels = [task.labels.index(names[i]) for i in labels]
        rows["label"] = list(labels)
    return rows


BUILDERS = {".csv": "csv", ".tsv": "csv", ".json": "json", ".jsonl": "json", ".parquet": "parquet"}


def read_table(path: Path) -> Any:
    """One CSV/TSV/JSON(L)/parquet file as a `datasets` table (TSV unquoted, as GLUE's)."""
    import datasets

    quiet_datasets_off_a_terminal()

    path = Path(path).expanduser()
    if path.suffix not in BUILDERS:
        raise ValueError(f"{path}: use a {sorted(BUILDERS)} file")
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing")
    options = {"delimiter": "\t", "quoting": csv.QUOTE_NONE} if path.suffix == ".tsv" else {}
    return datasets.load_dataset(
        BUILDERS[path.suffix], data_files=str(path), split="train", **options
    )


def read_file(path: Path, task: GlueTask, *, labeled: bool) -> dict[str, Any]:
    """A split from one CSV/TSV/JSON(L)/parquet file: a GLUE task's with the hub's column names
    (sentence, sentence1/sentence2, question/sentence, premise/hypothesis, question1/question2,
    label), the user's own task's with its named columns; labels may be ids or label strings."""
    return table_rows(read_table(path), task, labeled=labeled, source=path)


def table_rows(table: Any, task: GlueTask, *, labeled: bool, source: Path | str) -> dict[str, Any]:
    """A split's rows from a `datasets` table (`source` names it in errors)."""
    a, b, label = task.file_columns()
    wanted = [a, *([b] if b else []), *([label] if labeled else [])]
    missing = [c for c in wanted if c not in table.column_names]
    if missing:
        raise ValueError(f"{source} has no column {missing[0]!r} (columns: {table.column_names})")
    rows = {
        "text_a": [str(x) for x in table[a]],
        "text_b": [str(x) for x in table[b]] if b else None,
        "index": list(table["idx"]) if "idx" in table.column_names else list(range(len(table))),
    }
    if labeled:
        rows["label"] = _file_label_ids(task, list(table[label]), label, source)
    return rows


def _file_label_ids(task: GlueTask, values: list, column: str, path: Path | str) -> list:
    """A file's labels as ids: label strings by name; ints are ids unless they name a label
    (the user's own task's labels may be the ints themselves). Multi-label rows: lists of
    them, as multi-hot rows."""
    if task.multilabel:
        return _multi_hot(task, values, column, path)
    names = set(task.labels or ())
    ints = all(isinstance(v, int) for v in values)
    if task.labels is not None and ints and not (task.own and {str(v) for v in values} <= names):
        bad = [v for v in values if not 0 <= v < task.num_labels]
        if bad:
            raise ValueError(
                f"{path}: label {bad[0]} in column {column!r} is not one of "
                f"{list(range(task.num_labels))}"
            )
        return values
    return _label_ids(task, [str(v) for v in values], path, column)


def load_split(
    glue_dir: str, task: GlueTask, split: str, files: dict[str, str] | None = None
) -> dict[str, Any]:
    """A split from its file in `files` ({"train"|"dev"|"test": path}), else data.glue_dir,
    else the hub."""
    kind = "train" if split == "train" else "test" if split.startswith("test") else "dev"
    if files and files.get(kind):
        return read_file(Path(files[kind]), task, labeled=kind != "test")
    return (
        read_split(Path(glue_dir), task.name, split)
        if glue_dir
        else read_hub_split(task.name, split)
    )


def _multi_hot(task: GlueTask, values: list, column: str, path: Path | str) -> list[list[float]]:
    for row, value in enumerate(values):
        if not isinstance(value, list):
            raise ValueError(
                f"{path} row {row + 1}: column {column!r} holds {value!r}; task=multilabel "
                f'reads a list of labels per row (JSON lines: {{{column!r}: ["a", "b"]}})'
            )
    names = set(task.labels or ())
    for row, value in enumerate(values):
        unknown = [v for v in value if isinstance(v, str) and v not in names]
        if unknown:
            raise ValueError(
                f"{path} row {row + 1}: label {unknown[0]!r} in column {column!r} is not one "
                f"of {list(task.labels or ())}"
            )
    flat = [v for value in values for v in value]
    ids = iter(_file_label_ids(replace(task, multilabel=False), flat, column, path))
    rows = []
    for value in values:
        hot = [0.0] * task.num_labels
        for _ in value:
            hot[next(ids)] = 1.0
        rows.append(hot)
    return rows


def _label_ids(task: GlueTask, values: list[str], path: Path | str, column: str = "") -> list:
    column = column or task.label
    if task.labels is None:
        try:
            return [float(v) for v in values]
        except ValueError as err:
            raise ValueError(f"{path}: column {column!r} must hold numbers ({err})") from None
    ids = {label: i for i, label in enumerate(task.labels)}
    for row, value in enumerate(values):
        if value not in ids:
            raise ValueError(
                f"{path} row {row + 1}: label {value!r} in column {column!r} is "
                f"not one of {list(task.labels)}"
            )
    return [ids[v] for v in values]


def accuracy(pred: torch.Tensor, gold: torch.Tensor) -> float:
    from sklearn.metrics import accuracy_score

    return float(accuracy_score(gold.numpy(), pred.numpy()))


def f1(pred: torch.Tensor, gold: torch.Tensor) -> float:
    """Binary F1 of class 1 (0 when nothing is predicted or gold positive)."""
    from sklearn.metrics import f1_score

    return float(f1_score(gold.numpy(), pred.numpy(), zero_division=0.0))


def macro_f1(pred: torch.Tensor, gold: torch.Tensor) -> float:
    """F1 averaged over the classes (multi-label: over the labels), each weighing alike."""
    from sklearn.metrics import f1_score

    return float(
        f1_score(gold.long().numpy(), pred.long().numpy(), average="macro", zero_division=0.0)
    )


def micro_f1(pred: torch.Tensor, gold: torch.Tensor) -> float:
    """Multi-label: F1 of every (example, label) decision pooled."""
    from sklearn.metrics import f1_score

    return float(
        f1_score(gold.long().numpy(), pred.long().numpy(), average="micro", zero_division=0.0)
    )


def exact_match(pred: torch.Tensor, gold: torch.Tensor) -> float:
    """Multi-label: the share of examples whose whole label set is right (subset accuracy)."""
    from sklearn.metrics import accuracy_score

    return float(accuracy_score(gold.long().numpy(), pred.long().numpy()))


def mcc(pred: torch.Tensor, gold: torch.Tensor) -> float:
    """Matthews correlation (0 when a marginal is empty)."""
    from sklearn.metrics import matthews_corrcoef

    return float(matthews_corrcoef(gold.numpy(), pred.numpy()))


def pearson(pred: torch.Tensor, gold: torch.Tensor) -> float:
    """NaN when either side is constant."""
    from scipy.stats import pearsonr

    return _correlation(pearsonr, pred, gold)


def spearman(pred: torch.Tensor, gold: torch.Tensor) -> float:
    """Ties share their average rank. NaN when either side is constant."""
    from scipy.stats import spearmanr

    return _correlation(spearmanr, pred, gold)


def _correlation(function: Any, pred: torch.Tensor, gold: torch.Tensor) -> float:
    import warnings

    with warnings.catch_warnings():  # a constant side: NaN, said by the value
        warnings.simplefilter("ignore")
        return float(function(pred.double().numpy(), gold.double().numpy())[0])


METRICS = {
    "accuracy": accuracy,
    "f1": f1,
    "macro_f1": macro_f1,
    "micro_f1": micro_f1,
    "exact_match": exact_match,
    "mcc": mcc,
    "pearson": pearson,
    "spearman": spearman,
}


def score(task: GlueTask, pred: torch.Tensor, gold: torch.Tensor) -> dict[str, float]:
    """The task's metrics of predictions (class ids, or scores for regression)."""
    return {m: METRICS[m](pred, gold) for m in task.metrics}
