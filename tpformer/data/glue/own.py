"""task=classification, regression and multilabel: fine-tuning on the user's own files (CSV,
TSV, JSON lines, parquet) with named columns, as transformers' run_glue does with --train_file:
one text or a pair, any number of labels, given as strings or ints (multilabel: a list of them
per row). The task is a GlueTask like GLUE's, so features, batches, layouts and the export are
the same code."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tpformer.config.schema import GlueDataConfig
from tpformer.config.schema.choices import OWN_TASKS
from tpformer.data.glue.tasks import GlueTask, get_task, read_table, table_rows
from tpformer.progress import quiet_datasets_off_a_terminal

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
    if name != "regression" and data.labels:
        labels = tuple(data.labels)
        if len(labels) < 2:
            raise ValueError(f"data.labels={list(labels)}: task={name} needs at least 2 labels")
    elif name != "regression":
        table, source = source_table(data, "train")
        labels = labels_in(table, source, data.label_column)
        if len(labels) < 2:
            raise ValueError(
                f"task={name} needs at least 2 labels; {source} column {data.label_column!r} "
                f"holds only {list(labels)} (set data.labels=[...] to name them all)"
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


def labels_in(table: Any, source: Path | str, column: str) -> tuple[str, ...]:
    """The distinct values of a table's label column (of its lists' items), sorted (ints by
    value), as strings."""
    if column not in table.column_names:
        raise ValueError(
            f"{source} has no column {column!r} (columns: {table.column_names}); set "
            "data.label_column"
        )
    values = {v for x in table[column] for v in (x if isinstance(x, list) else [x])}
    ordered = (
        sorted(values) if all(isinstance(v, int) for v in values) else sorted(map(str, values))
    )
    return tuple(str(v) for v in ordered)


DATASET_SPLITS = {"train": ("train",), "dev": ("validation", "dev"), "test": ("test",)}
"""Which split of data.dataset serves each of the job's splits (the first present)."""


def source_table(data: GlueDataConfig, kind: str) -> tuple[Any, str]:
    """The table of the job's `kind` split (train, dev, test) and its name for messages: from
    data.dataset, else data.<kind>_file. FileNotFoundError when the dataset lacks the split."""
    if not data.dataset:
        path = getattr(data, f"{kind}_file")
        return read_table(Path(path)), path
    splits = dataset_splits(data)
    for name in DATASET_SPLITS[kind]:
        if name in splits:
            return splits[name], f"data.dataset={data.dataset} split {name}"
    raise FileNotFoundError(
        f"data.dataset={data.dataset} has no {' or '.join(DATASET_SPLITS[kind])} split "
        f"(splits: {sorted(splits)})"
    )


def dataset_splits(data: GlueDataConfig) -> Any:
    """data.dataset's splits (datasets caches them after the first load)."""
    import datasets

    quiet_datasets_off_a_terminal()
    return datasets.load_dataset(data.dataset, data.dataset_config or None)


def dataset_rows(data: GlueDataConfig, task: GlueTask, kind: str) -> tuple[dict[str, Any], str]:
    """A split's rows from data.dataset, and the table's fingerprint (the features' cache key)."""
    table, source = source_table(data, kind)
    return table_rows(table, task, labeled=kind != "test", source=source), table._fingerprint
