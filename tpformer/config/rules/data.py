"""The rules of the data group: each corpus (data.* or an item of data.blend) names what it
needs, and a blend's weights and labels are well formed."""

from __future__ import annotations

from tpformer.config.rules.choices import check_choices
from tpformer.config.schema import CorpusConfig, DataConfig, GlueDataConfig, SentencePairs
from tpformer.config.schema.choices import OWN_TASKS


def _validate_corpus(corpus: CorpusConfig, key: str, tokenizer: str) -> None:
    """The keys one corpus (data.* or an item of data.blend, named by `key`) needs."""
    if corpus.source in ("text", "jsonl") and not corpus.paths:
        raise ValueError(f"{key}source={corpus.source} needs {key}paths=[file, ...]")
    if corpus.source == "hf" and not corpus.name:
        raise ValueError(
            f"{key}source=hf needs {key}name (a hub dataset such as wikitext, or a "
            "builder such as json, parquet or arrow with data.paths=[...])"
        )
    if corpus.source == "megatron":
        if len(corpus.paths) != 1:
            raise ValueError(
                f"{key}source=megatron needs {key}paths=[prefix] (one Megatron-LM dataset: "
                f"<prefix>.bin and <prefix>.idx), got {list(corpus.paths)}; blend several "
                "with data.blend"
            )
        if not tokenizer:
            raise ValueError(
                f"{key}source=megatron holds token ids already: set data.tokenizer to the "
                "tokenizer they were written with (an HF directory or tokenizer.json, or a "
                "sentencepiece .model)"
            )
    if corpus.documents != "blank_line" and corpus.source != "text":
        raise ValueError(
            f"{key}documents={corpus.documents} applies to source=text; a {corpus.source} "
            "corpus's documents are its rows (or its index's documents)"
        )


def validate_data(data: DataConfig) -> None:
    check_choices(data, "data.")
    if not data.blend:
        _validate_corpus(data, "data.", data.tokenizer)
        return
    if data.paths:
        raise ValueError(
            f"data.blend replaces data.source and data.paths: move data.paths={list(data.paths)} "
            "into an item of data.blend"
        )
    for i, part in enumerate(data.blend):
        check_choices(part, f"data.blend[{i}].")
        if part.source == "synthetic":
            raise ValueError(f"data.blend[{i}].source=synthetic cannot be blended; pick a corpus")
        _validate_corpus(part, f"data.blend[{i}].", data.tokenizer)
    labels = [part.label for part in data.blend if part.label]
    if len(set(labels)) != len(labels):
        raise ValueError(f"data.blend labels {labels} must differ")


def validate_packing(data: DataConfig, arch: str, context: int) -> None:
    """data.pack: documents packed into sequences need a corpus, no sentence pairs (BERT) and
    attention that takes their document mask (not ring attention)."""
    if not data.pack:
        return
    if context > 1:
        raise ValueError(
            f"data.pack=true runs without context parallelism (parallel.context={context}): "
            "ring attention takes a key padding mask, not packed documents' mask; set "
            "parallel.context=1 or data.pack=false"
        )
    if data.source == "synthetic" and not data.blend:
        raise ValueError(
            "data.pack=true packs a corpus's documents, and data.source=synthetic has none: "
            "set data.source (text, jsonl, hf, megatron) or data.pack=false"
        )
    if arch != "gpt" and data.sentence_pairs != SentencePairs.none:
        raise ValueError(
            f"data.pack=true packs MLM-only samples; data.sentence_pairs="
            f"{data.sentence_pairs.value} makes sentence pairs: set data.sentence_pairs=none"
        )


OWN_TASK_KEYS = (
    "dataset",
    "dataset_config",
    "text_column",
    "text_pair_column",
    "label_column",
    "labels",
)


def validate_task_data(task: str, data: GlueDataConfig) -> None:
    """A GLUE task reads its own columns; classification, regression and multilabel read the
    user's files by the columns named in data.*."""
    defaults = GlueDataConfig()
    if task not in OWN_TASKS:
        given = [k for k in OWN_TASK_KEYS if getattr(data, k) != getattr(defaults, k)]
        if given:
            raise ValueError(
                f"data.{given[0]} applies to task=classification, regression or multilabel; "
                f"task={task} reads GLUE's own columns"
            )
        return
    files = [k for k in ("train_file", "dev_file", "test_file") if getattr(data, k)]
    if data.dataset and files:
        raise ValueError(
            f"data.dataset={data.dataset} and data.{files[0]} both name the data: give one"
        )
    missing = [k for k in ("train_file", "dev_file") if k not in files]
    if (missing and not data.dataset) or data.glue_dir:
        raise ValueError(
            f"task={task} reads your own files: set data.train_file and data.dev_file (and "
            "optionally data.test_file) to CSV/TSV/JSON(L)/parquet files, or data.dataset to "
            "a Hugging Face dataset"
            + (f"; data.glue_dir={data.glue_dir} is for GLUE tasks" if data.glue_dir else "")
        )
    if task == "regression" and data.labels:
        raise ValueError(
            f"data.labels={list(data.labels)} applies to task=classification or multilabel"
        )
