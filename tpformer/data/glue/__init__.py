"""GLUE: task definitions and readers (tasks.py), tokenized features (features.py), the
layout-independent order of training examples and prediction batches (batches.py), and the
benchmark's submission files (submission.py). The training loop knows none of it."""

from tpformer.data.glue.tasks import (
    TASKS,
    GlueTask,
    get_task,
    load_split,
    read_file,
    read_split,
    score,
)

__all__ = ["TASKS", "GlueTask", "get_task", "load_split", "read_file", "read_split", "score"]
