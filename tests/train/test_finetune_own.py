"""task=classification / task=regression end to end, as docs/finetuning.md runs them: three
string labels over sentence pairs in CSV files, the documented command at TP=2 on 2 processes
against the same job in one process (losses within FP32_MODEL_REL, the same dev predictions),
the labels stored in the checkpoint and exported as id2label (transformers predicts the label
names tpformer wrote); a regression on JSON lines in one process; multi-label rows at TP=2."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch

from tests.docs.commands import arguments, documented
from tests.tolerances import FP32_MODEL_REL
from tests.train.test_finetune import FILLER, _cli, _predictions, lines_of, write_hf_bert
from tpformer.api import compose_config
from tpformer.parallel.context import ParallelContext

pytestmark = pytest.mark.slow  # console-script runs, 2 ranks

SENTIMENT = {"good": "positive", "bad": "negative", "sleeps": "neutral"}
TRAINER = {"epochs": 1, "batch_size": 8}
LR = 1e-3


def _review_rows(n: int, seed: int) -> list[dict]:
    """The label is the word among the review's fillers (good, bad or neither); the title is
    noise, so the pair's second text is read but does not decide."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        word = rng.choice(sorted(SENTIMENT))
        review = rng.choices(FILLER, k=rng.randint(3, 8))
        review.insert(rng.randrange(len(review) + 1), word)
        title = " ".join(rng.choices(FILLER, k=rng.randint(1, 3)))
        rows.append({"review": " ".join(review), "title": title, "sentiment": SENTIMENT[word]})
    return rows


def _write_csv(path: Path, rows: list[dict], labeled: bool = True) -> Path:
    columns = ["review", "title", *(["sentiment"] if labeled else [])]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        "\n".join([",".join(columns), *(",".join(r[c] for c in columns) for r in rows)]) + "\n"
    )
    return path


def test_own_labels_at_tp2_give_the_one_process_run_and_export_as_id2label(
    tmp_path: Path,
) -> None:
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from tpformer.convert import to_hf

    files = {
        "train": _write_csv(tmp_path / "reviews" / "train.csv", _review_rows(32, 1)),
        "dev": _write_csv(tmp_path / "reviews" / "dev.csv", _review_rows(12, 2)),
        "test": _write_csv(tmp_path / "reviews" / "test.csv", _review_rows(6, 3), False),
    }
    hf = write_hf_bert(tmp_path / "hf", dropout=0.1)
    command = documented("tpformer-finetune task=classification")
    _, argv = arguments(
        command,
        {"path/to/bert": str(hf), **{f"reviews/{k}.csv": str(v) for k, v in files.items()}},
    )
    run = tmp_path / "run"
    job = [*argv, *(f"trainer.{k}={v}" for k, v in TRAINER.items()), f"optim.lr={LR}",
           "optim.warmup_steps=2", f"data.cache_dir={tmp_path}", "trainer.progress=false",
           "trainer.loggers=[]", "trainer.plot=false"]  # fmt: skip
    done = _cli([*job, f"hydra.run.dir={run}"], tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    one_process = [a for a in job if not a.startswith(("parallel.", "launcher."))]
    config = compose_config("finetune", *one_process)  # the same job here, by the Python API
    want_pred, want_loss = _predictions(
        ParallelContext.single(device="cpu"), config, str(tmp_path / "one")
    )
    records = [json.loads(line) for line in lines_of(run / "metrics.jsonl")]
    got_loss = [r["loss"] for r in records if not r.get("eval")]
    assert got_loss == pytest.approx(want_loss, rel=FP32_MODEL_REL)
    results = json.loads((run / "results.json").read_text())
    labels = ["negative", "neutral", "positive"]
    assert set(results["best"]) >= {"accuracy", "macro_f1"}, results
    best = run / "best" / f"step{results['best']['step']:08d}"
    assert json.loads((best / "meta.json").read_text())["id2label"] == {
        str(i): label for i, label in enumerate(labels)
    }
    to_hf(best, tmp_path / "exported")
    model = AutoModelForSequenceClassification.from_pretrained(tmp_path / "exported").eval()
    assert model.config.id2label == dict(enumerate(labels))
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "exported")

    def predicted(rows: list[dict]) -> list[int]:
        batch = tokenizer(
            [r["review"] for r in rows], [r["title"] for r in rows], padding=True,
            return_tensors="pt",
        )  # fmt: skip
        with torch.no_grad():
            return model(**batch).logits.argmax(-1).tolist()

    assert predicted(_review_rows(12, 2)) == want_pred.int().tolist()  # the dev split's
    written = [line.split("\t") for line in lines_of(run / "predictions" / "test.tsv")]
    assert written[0] == ["index", "prediction"]
    assert [row[1] for row in written[1:]] == [labels[i] for i in predicted(_review_rows(6, 3))]


def test_own_regression_on_json_lines_runs_the_documented_command(tmp_path: Path) -> None:
    rng = random.Random(4)
    pairs = tmp_path / "pairs"
    pairs.mkdir()
    for split, n in (("train", 16), ("dev", 8)):
        rows = []
        for _ in range(n):
            a, b = (" ".join(rng.choices(FILLER, k=4)) for _ in range(2))
            rows.append({"sentence1": a, "sentence2": b, "score": len(set(a) & set(b)) / 4})
        (pairs / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    _, argv = arguments(
        documented("tpformer-finetune task=regression"),
        {"path/to/bert": str(write_hf_bert(tmp_path / "hf"))},
    )
    done = _cli(
        [*argv, "trainer.epochs=1", "trainer.batch_size=8", f"data.cache_dir={tmp_path}",
         "trainer.progress=false", "trainer.loggers=[]", "trainer.plot=false",
         f"hydra.run.dir={tmp_path / 'run'}"],
        tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert {"pearson", "spearman"} <= set(results["best"]), results
    meta = json.loads(next((tmp_path / "run" / "best").glob("step*/meta.json")).read_text())
    assert (meta["num_labels"], meta["id2label"]) == (1, {"0": "score"})


TOPICS = {"good": "mood", "sleeps": "rest", "bad": "mood"}


def _topic_rows(n: int, seed: int) -> list[dict]:
    """The topics are those of the marker words in the text (none, one or two of them)."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        words = rng.choices(FILLER, k=rng.randint(3, 6))
        markers = rng.sample(sorted(TOPICS), k=rng.randint(0, 2))
        for word in markers:
            words.insert(rng.randrange(len(words) + 1), word)
        rows.append({"text": " ".join(words), "topics": sorted({TOPICS[m] for m in markers})})
    return rows


def test_multilabel_at_tp2_gives_the_one_process_run_and_exports_its_problem_type(
    tmp_path: Path,
) -> None:
    """The documented command in one process, the same composed job at TP=2 through the
    Python API (run_distributed): the same losses and dev rows; the export is a
    multi_label_classification model whose sigmoids give tpformer's rows."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from tests.dist import run_distributed
    from tpformer.convert import to_hf

    topics = tmp_path / "topics"
    topics.mkdir()
    dev = _topic_rows(12, 6)
    for split, rows in (("train", _topic_rows(32, 5)), ("dev", dev)):
        (topics / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    _, argv = arguments(
        documented("tpformer-finetune task=multilabel"),
        {"path/to/bert": str(write_hf_bert(tmp_path / "hf", dropout=0.1))},
    )
    job = [*argv, "trainer.epochs=1", "trainer.batch_size=8", f"optim.lr={LR}",
           f"data.cache_dir={tmp_path}", "trainer.progress=false", "trainer.loggers=[]",
           "trainer.plot=false"]  # fmt: skip
    done = _cli([*job, f"hydra.run.dir={tmp_path / 'run'}"], tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    config = compose_config("finetune", *job)
    config.data.train_file = str(topics / "train.jsonl")  # the job ran in tmp_path
    config.data.dev_file = str(topics / "dev.jsonl")
    config.parallel.tensor = 2
    for pred, loss in run_distributed(_predictions, 2, config, str(tmp_path / "tp2"), tensor=2):
        records = [json.loads(line) for line in lines_of(tmp_path / "run" / "metrics.jsonl")]
        assert loss == pytest.approx(
            [r["loss"] for r in records if not r.get("eval")], rel=FP32_MODEL_REL
        )
        rows = pred
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert {"micro_f1", "macro_f1", "exact_match"} <= set(results["best"]), results
    to_hf(next((tmp_path / "run" / "best").glob("step*")), tmp_path / "exported")
    model = AutoModelForSequenceClassification.from_pretrained(tmp_path / "exported").eval()
    assert model.config.problem_type == "multi_label_classification"
    assert model.config.id2label == {0: "mood", 1: "rest"}
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "exported")
    with torch.no_grad():
        logits = model(
            **tokenizer([r["text"] for r in dev], padding=True, return_tensors="pt")
        ).logits
    assert torch.equal((logits.sigmoid() > 0.5).float(), rows)
