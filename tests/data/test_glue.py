"""GLUE files in each task's own layout, label checks, and the metrics against hand-computed
values."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from tpformer.data.glue import TASKS, read_split, score

HEADERS = {
    "SST-2": "sentence\tlabel",
    "MRPC": "Quality\t#1 ID\t#2 ID\t#1 String\t#2 String",
    "STS-B": "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2"
    "\tscore",
    "QQP": "id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate",
    "MNLI": "index\tpromptID\tpairID\tgenre\tsentence1\tsentence2\tgold_label",
    "QNLI": "index\tquestion\tsentence\tlabel",
    "RTE": "index\tsentence1\tsentence2\tlabel",
    "WNLI": "index\tsentence1\tsentence2\tlabel",
}


def glue_row(task: str, i: int, a: str, b: str, label: str) -> str:
    """One line of `task`'s train/dev file with texts a, b and the label string."""
    return {
        "CoLA": f"gj04\t{label}\t\t{a}",
        "SST-2": f"{a}\t{label}",
        "MRPC": f"{label}\t{i}\t{i + 1}\t{a}\t{b}",
        "STS-B": f"{i}\tmain\tf\t2012\t{i}\tx\ty\t{a}\t{b}\t{label}",
        "QQP": f"{i}\t{i}\t{i + 1}\t{a}\t{b}\t{label}",
        "MNLI": f"{i}\t1\t1g\tfiction\t{a}\t{b}\t{label}",
        "QNLI": f"{i}\t{a}\t{b}\t{label}",
        "RTE": f"{i}\t{a}\t{b}\t{label}",
        "WNLI": f"{i}\t{a}\t{b}\t{label}",
    }[task]


def write_glue_file(root: Path, task: str, split: str, rows: list[tuple[str, str, str]]) -> Path:
    path = root / task / f"{split}.tsv"
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [] if task == "CoLA" else [HEADERS[task]]
    lines += [glue_row(task, i, a, b, label) for i, (a, b, label) in enumerate(rows)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


@pytest.mark.parametrize("name", sorted(TASKS))
def test_every_task_reads_its_own_layout(tmp_path: Path, name: str) -> None:
    task = TASKS[name]
    label_strings = list(task.labels) if task.labels else ["0.5", "4.25"]
    rows = [
        (f'He said "yes" {i}', f"other {i}", label_strings[i % len(label_strings)])
        for i in range(5)
    ]
    write_glue_file(tmp_path, task.directory, task.dev_splits[0], rows)
    data = read_split(tmp_path, name, task.dev_splits[0])
    assert data["text_a"] == [r[0] for r in rows]  # quotes kept: GLUE files are not CSV-quoted
    if task.text_b:
        assert data["text_b"] == [r[1] for r in rows]
    expected = (
        [float(r[2]) for r in rows]
        if task.labels is None
        else [task.labels.index(r[2]) for r in rows]
    )
    assert data["label"] == expected


def test_bad_files_name_the_file_and_column(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"RTE/train.tsv is missing"):
        read_split(tmp_path, "rte", "train")
    write_glue_file(tmp_path, "RTE", "train", [("a", "b", "maybe")])
    with pytest.raises(
        ValueError,
        match=r"RTE/train.tsv row 1: label 'maybe' in column 'label' "
        r"is not one of \['entailment', 'not_entailment'\]",
    ):
        read_split(tmp_path, "rte", "train")
    (tmp_path / "RTE" / "dev.tsv").write_text(
        "index\tpremise\thypothesis\tlabel\n0\ta\tb\tentailment\n"
    )
    with pytest.raises(ValueError, match=r"RTE/dev.tsv has no column 'sentence1'"):
        read_split(tmp_path, "rte", "dev")
    with pytest.raises(ValueError, match=r"task='glu' is not a GLUE task; use one of \['cola'"):
        read_split(tmp_path, "glu", "dev")


def test_metrics_match_hand_computed_values() -> None:
    pred = torch.tensor([1, 1, 0, 0, 1, 0, 1, 1])
    gold = torch.tensor([1, 0, 0, 1, 1, 0, 1, 0])
    # tp=3 fp=2 tn=2 fn=1
    assert score(TASKS["sst2"], pred, gold) == {"accuracy": 5 / 8}
    assert score(TASKS["mrpc"], pred, gold)["f1"] == pytest.approx(2 * 3 / (2 * 3 + 2 + 1))
    assert score(TASKS["cola"], pred, gold)["mcc"] == pytest.approx(
        (3 * 2 - 2 * 1) / math.sqrt(5 * 4 * 4 * 3)
    )
    x = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0])
    y = torch.tensor([2.0, 1.0, 4.0, 3.0, 5.0])
    stsb = score(TASKS["stsb"], x, y)
    assert stsb["pearson"] == pytest.approx(0.8)  # cov 8 / (sqrt(10) sqrt(10))
    assert stsb["spearman"] == pytest.approx(0.8)
    ties = score(TASKS["stsb"], torch.tensor([1.0, 1.0, 2.0]), torch.tensor([1.0, 2.0, 3.0]))
    assert ties["spearman"] == pytest.approx(math.sqrt(3) / 2)  # ranks 1.5, 1.5, 3 vs 1, 2, 3


def test_csv_json_and_parquet_files_with_hub_columns(tmp_path: Path) -> None:
    import datasets

    from tpformer.data.glue import load_split, read_file

    rows = {
        "premise": ["A man sleeps.", "It rains."],
        "hypothesis": ["He rests.", "It is dry."],
        "label": [1, 0],
    }
    datasets.Dataset.from_dict(rows).to_parquet(str(tmp_path / "dev.parquet"))
    (tmp_path / "train.jsonl").write_text(
        "".join(
            json.dumps({"premise": p, "hypothesis": h, "label": lab}) + "\n"
            for p, h, lab in zip(rows["premise"], rows["hypothesis"], ["neutral", "contradiction"])
        )
    )
    (tmp_path / "test.csv").write_text("idx,premise,hypothesis\n7,A b.,C d.\n")
    files = {
        "train": str(tmp_path / "train.jsonl"),
        "dev": str(tmp_path / "dev.parquet"),
        "test": str(tmp_path / "test.csv"),
    }
    dev = load_split("", TASKS["mnli"], "dev_matched", files)
    assert dev["text_a"] == rows["premise"] and dev["label"] == [1, 0]
    assert load_split("", TASKS["mnli"], "train", files)["label"] == [2, 0]  # label strings -> ids
    test = load_split("", TASKS["mnli"], "test_matched", files)
    assert test["index"] == [7] and "label" not in test
    (tmp_path / "bad.csv").write_text("premise,hypothesis,label\na,b,5\n")
    with pytest.raises(
        ValueError, match=r"bad.csv: label 5 in column 'label' is not one of \[0, 1, 2\]"
    ):
        read_file(tmp_path / "bad.csv", TASKS["mnli"], labeled=True)
    with pytest.raises(ValueError, match=r"bad.csv has no column 'question'"):
        read_file(tmp_path / "bad.csv", TASKS["qnli"], labeled=True)
