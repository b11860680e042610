"""task=classification / task=regression on the user's own files: the labels found or given,
label values as strings or ints, the columns named by data.*, the errors a user meets early,
and the metrics (scikit-learn's macro F1 against a count made here)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tpformer.config.rules.data import validate_task_data
from tpformer.config.schema import GlueDataConfig
from tpformer.data.glue import TASKS, read_file, score
from tpformer.data.glue.own import finetune_task


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def test_three_string_labels_of_single_sentences_are_found_sorted(tmp_path: Path) -> None:
    """The issue's case: a three-class single-sentence file (GLUE's tasks refused label 2)."""
    train = tmp_path / "train.csv"
    train.write_text("review,stars\nfine,neutral\ngreat,positive\nawful,negative\nok,neutral\n")
    data = GlueDataConfig(train_file=str(train), text_column="review", label_column="stars")
    task = finetune_task("classification", data)
    assert task.labels == ("negative", "neutral", "positive") and task.num_labels == 3
    assert (task.text_a, task.text_b, task.metrics) == ("review", None, ("accuracy", "macro_f1"))
    rows = read_file(train, task, labeled=True)
    assert rows["text_a"] == ["fine", "great", "awful", "ok"] and rows["text_b"] is None
    assert rows["label"] == [1, 2, 0, 1]


def test_int_labels_are_names_when_found_and_ids_when_given_names(tmp_path: Path) -> None:
    rows = [
        {"q": "a", "p": "b", "y": 5},
        {"q": "c", "p": "d", "y": 0},
        {"q": "e", "p": "f", "y": 2},
    ]
    train = _jsonl(tmp_path / "train.jsonl", rows)
    data = GlueDataConfig(
        train_file=str(train), text_column="q", text_pair_column="p", label_column="y"
    )
    task = finetune_task("classification", data)
    assert task.labels == ("0", "2", "5")
    assert read_file(train, task, labeled=True)["label"] == [2, 0, 1]
    assert read_file(train, task, labeled=True)["text_b"] == ["b", "d", "f"]
    ids = _jsonl(
        tmp_path / "ids.jsonl", [{"q": "a", "p": "b", "y": 1}, {"q": "c", "p": "d", "y": 0}]
    )
    named = finetune_task(
        "classification", GlueDataConfig(**{**vars(data), "labels": ["no", "yes"]})
    )
    assert named.labels == ("no", "yes")
    assert read_file(ids, named, labeled=True)["label"] == [1, 0]  # ints index data.labels
    many = _jsonl(
        tmp_path / "many.jsonl", [{"q": "a", "p": "b", "y": 10}, {"q": "c", "p": "d", "y": 9}]
    )
    assert finetune_task(  # ints sorted by value, not as strings
        "classification", GlueDataConfig(**{**vars(data), "train_file": str(many)})
    ).labels == ("9", "10")


def test_regression_reads_numbers_from_its_column(tmp_path: Path) -> None:
    train = tmp_path / "train.tsv"
    train.write_text("a\tb\tscore\nx y\tz\t0.25\nw\tv\t3\n")
    data = GlueDataConfig(
        train_file=str(train), text_pair_column="b", text_column="a", label_column="score"
    )
    task = finetune_task("regression", data)
    assert (task.labels, task.num_labels, task.metrics) == (None, 1, ("pearson", "spearman"))
    assert read_file(train, task, labeled=True)["label"] == [0.25, 3.0]
    train.write_text("a\tb\tscore\nx\tz\thigh\n")
    with pytest.raises(ValueError, match=r"train.tsv: column 'score' must hold numbers"):
        read_file(train, task, labeled=True)


def test_bad_labels_and_columns_are_named(tmp_path: Path) -> None:
    train = tmp_path / "train.csv"
    train.write_text("text,label\nfine,pos\nbad,neg\n")
    task = finetune_task("classification", GlueDataConfig(train_file=str(train)))
    dev = tmp_path / "dev.csv"
    dev.write_text("text,label\nmeh,neutral\n")
    with pytest.raises(
        ValueError,
        match=r"dev.csv row 1: label 'neutral' in column 'label' is not one of \['neg', 'pos'\]",
    ):
        read_file(dev, task, labeled=True)
    one = tmp_path / "one.csv"
    one.write_text("text,label\nfine,pos\ngood,pos\n")
    with pytest.raises(
        ValueError, match=r"needs at least 2 labels; .*one.csv column 'label' holds only \['pos'\]"
    ):
        finetune_task("classification", GlueDataConfig(train_file=str(one)))
    with pytest.raises(
        ValueError, match=r"train.csv has no column 'stars' .*set data.label_column"
    ):
        finetune_task("classification", GlueDataConfig(train_file=str(train), label_column="stars"))
    with pytest.raises(ValueError, match=r"train.csv has no column 'review'"):
        read_file(
            train, finetune_task("regression", GlueDataConfig(text_column="review")), labeled=False
        )


@pytest.mark.parametrize(
    ("task", "data", "message"),
    [
        (
            "classification",
            {"dev_file": "d.csv"},
            r"task=classification reads your own files: set data.train_file and data.dev_file",
        ),
        (
            "classification",
            {"dataset": "imdb", "train_file": "t.csv"},
            r"data.dataset=imdb and data.train_file both name the data: give one",
        ),
        (
            "regression",
            {"train_file": "t.csv", "dev_file": "d.csv", "glue_dir": "glue"},
            r"data.glue_dir=glue is for GLUE tasks",
        ),
        (
            "sst2",
            {"text_column": "review"},
            r"data.text_column applies to task=classification, regression or multilabel; task=sst2 "
            r"reads GLUE.s own columns",
        ),
        (
            "regression",
            {"train_file": "t.csv", "dev_file": "d.csv", "labels": ["a", "b"]},
            r"data.labels=\['a', 'b'\] applies to task=classification or multilabel",
        ),
    ],
)
def test_the_task_and_its_data_keys_must_agree(task: str, data: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        validate_task_data(task, GlueDataConfig(**data))


def test_macro_f1_is_the_mean_of_the_classes_f1() -> None:
    pred = torch.tensor([0, 1, 2, 2, 1, 0])
    gold = torch.tensor([0, 1, 1, 2, 2, 2])
    # class 0: tp 1 fp 1 fn 0 -> 2/3; class 1: tp 1 fp 1 fn 1 -> 1/2; class 2: tp 1 fp 1 fn 2 -> 2/5
    own = finetune_task("classification", GlueDataConfig(labels=["a", "b", "c"]))
    got = score(own, pred, gold)
    assert got["accuracy"] == pytest.approx(3 / 6)
    assert got["macro_f1"] == pytest.approx((2 / 3 + 1 / 2 + 2 / 5) / 3)
    assert score(TASKS["mrpc"], pred.clamp(max=1), gold.clamp(max=1))["f1"] == pytest.approx(
        2 * 4 / (2 * 4 + 0 + 1)  # class 1 of the clamped rows: tp 4, fp 0, fn 1
    )


def test_multilabel_rows_are_multi_hot_over_the_labels_found(tmp_path: Path) -> None:
    rows = [
        {"text": "a", "topics": ["sport", "news"]},
        {"text": "b", "topics": []},
        {"text": "c", "topics": ["art"]},
    ]
    train = _jsonl(tmp_path / "train.jsonl", rows)
    data = GlueDataConfig(train_file=str(train), label_column="topics")
    task = finetune_task("multilabel", data)
    assert (task.labels, task.multilabel, task.float_labels) == (
        ("art", "news", "sport"),
        True,
        True,
    )
    assert task.metrics == ("micro_f1", "macro_f1", "exact_match")
    assert read_file(train, task, labeled=True)["label"] == [[0, 1, 1], [0, 0, 0], [1, 0, 0]]
    bad = _jsonl(
        tmp_path / "bad.jsonl",
        [{"text": "a", "topics": ["art"]}, {"text": "b", "topics": ["art", "food"]}],
    )
    with pytest.raises(
        ValueError,
        match=r"bad.jsonl row 2: label 'food' in column 'topics' is not one of "
        r"\['art', 'news', 'sport'\]",
    ):
        read_file(bad, task, labeled=True)
    csv = tmp_path / "flat.csv"
    csv.write_text("text,topics\na,art\n")
    with pytest.raises(
        ValueError,
        match=r"flat.csv row 1: column 'topics' holds 'art'; task=multilabel reads a list of "
        r"labels per row",
    ):
        read_file(csv, task, labeled=True)


def test_multilabel_metrics_pool_or_average_the_labels() -> None:
    gold = torch.tensor([[1, 0, 1], [0, 1, 0], [1, 1, 0], [0, 0, 1]]).float()
    pred = torch.tensor([[1, 0, 0], [0, 1, 0], [1, 0, 1], [0, 0, 1]]).float()
    # label 0: tp 2 -> F1 1; label 1: tp 1 fn 1 -> 2/3; label 2: tp 1 fp 1 fn 1 -> 1/2
    # pooled: tp 4, fp 1, fn 2 -> 8 / 11; whole rows right: 2 of 4
    own = finetune_task("multilabel", GlueDataConfig(labels=["a", "b", "c"]))
    got = score(own, pred, gold)
    assert got["micro_f1"] == pytest.approx(8 / 11)
    assert got["macro_f1"] == pytest.approx((1 + 2 / 3 + 1 / 2) / 3)
    assert got["exact_match"] == pytest.approx(2 / 4)


def test_a_hugging_face_dataset_serves_the_splits_by_name(tmp_path: Path) -> None:
    """data.dataset as load_dataset takes it (here a local directory of split files; a hub id
    goes the same way through the hub's cache): train, validation as dev, test if present;
    the labels found in its train split; its fingerprint keys the tokenized cache."""
    from tests.train.test_finetune import write_hf_bert
    from tpformer.data.glue.features import load_examples, test_splits
    from tpformer.data.tokenizer import Tokenizer

    folder = tmp_path / "reviews"
    folder.mkdir()
    (folder / "train.csv").write_text("text,label\ngood,pos\nbad,neg\nfine,pos\n")
    (folder / "validation.csv").write_text("text,label\nbad,neg\n")
    data = GlueDataConfig(dataset=str(folder), cache_dir=str(tmp_path / "cache"))
    task = finetune_task("classification", data)
    assert task.labels == ("neg", "pos") and test_splits(task, data) == []
    tokenizer = Tokenizer(write_hf_bert(tmp_path / "hf"))
    train = load_examples(task, data, "train", tokenizer, rank=0)
    assert [e["label"] for e in train] == [1, 0, 1]
    assert [e["label"] for e in load_examples(task, data, "dev", tokenizer, rank=0)] == [0]
    (folder / "test.csv").write_text("text\nfine\n")
    assert test_splits(task, data) == ["test"]
    assert "label" not in load_examples(task, data, "test", tokenizer, rank=0)[0]
    (folder / "validation.csv").unlink()
    with pytest.raises(
        FileNotFoundError,
        match=r"data.dataset=.*reviews has no validation or dev split "
        r"\(splits: \['test', 'train'\]\)",
    ):
        load_examples(task, data, "dev", tokenizer, rank=0)
