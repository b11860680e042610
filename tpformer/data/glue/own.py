"""task=classification, regression and multilabel: fine-tuning on the user's own files (CSV,
TSV, JSON lines, parquet) with named columns, as transformers' run_glue does with --train_file:
one text or a pair, any number of labels, given as strings or ints (multilabel: a list of them
per row). The task is a GlueTask like GLUE's, so features, batches, layouts and the export are
the same code."""

from __future__ import annotations

from pathlib import Path

from tpformer.config.schema import GlueDataConfig
from tpformer.data.glue.tasks import GlueTask, get_task, read_table

OWN_TASKS = ("classification", "regression", "multilabel")
OWN_METRICS = {
    "classification": ("accuracy", "macro_f1"),
    "regression": ("pearson", "spearman"),
    "multilabel": ("micro_f1", "macro_f1", "exact_match"),
}
"""The first decides the best checkpoint."""


def finetune_task(name: str, data: GlueDataConfig) -> GlueTask:
    """task=<name>: a GLUE task, or the user's own task over data.text_column,
    data.text_pair_column and data.label_column, its labels data.labels or, when none are
    given, the training file's distinct labels, sorted (numbers by value)."""
    if name not in OWN_TASKS:
        return get_task(name)
    labels = None
    if name != "regression":
        labels = tuple(data.labels) or labels_in(Path(data.train_file), data.label_column)
        if len(labels) < 2:
            raise ValueError(
                f"task={name} needs at least 2 labels; {data.train_file} column "
                f"{data.label_column!r} holds only {list(labels)} (set data.labels=[...] to "
                "name them all)"
            )
    return GlueTask(
        directory="",
        text_a=data.text_column,
        text_b=data.text_pair_column or None,
        label=data.label_column,
        labels=labels,
        metrics=OWN_METRICS[name],
        dev_splits=("dev",),
        test_splits=("test",),
        name=name,
        own=True,
        multilabel=name == "multilabel",
    )


def labels_in(path: Path, column: str) -> tuple[str, ...]:
    """The distinct values of a file's label column (of its lists' items), sorted (ints by
    value), as strings."""
    table = read_table(path)
    if column not in table.column_names:
        raise ValueError(
            f"{path} has no column {column!r} (columns: {table.column_names}); set "
            "data.label_column"
        )
    values = {v for x in table[column] for v in (x if isinstance(x, list) else [x])}
    ordered = (
        sorted(values) if all(isinstance(v, int) for v in values) else sorted(map(str, values))
    )
    return tuple(str(v) for v in ordered)
