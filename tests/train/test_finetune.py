"""GLUE fine-tuning: a learnable synthetic task end to end at TP=2 through the CLI, the same dev
predictions at TP=1 and TP=2, results/predictions files, and the errors of bad input."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from tests.cli.forked import run_script
from tests.data.test_glue import write_glue_file
from tests.dist import run_distributed
from tests.docs.commands import arguments, documented
from tests.tolerances import FP32_MODEL_REL, assert_rel_close
from tests.train.test_trainer import REPO
from tpformer.config.schema import (
    FinetuneConfig,
    FinetuneTrainerConfig,
    GlueDataConfig,
    OptimConfig,
    ParallelConfig,
)
from tpformer.data.tokenizer import SPECIAL_TOKENS
from tpformer.parallel.context import ParallelContext
from tpformer.train.finetuning import finetuning_trainer, write_results

WORDS = [
    "good",
    "bad",
    "the",
    "movie",
    "plot",
    "was",
    "acting",
    "very",
    "quite",
    "and",
    "a",
    "film",
    "story",
    "music",
    "is",
    "really",
    "not",
    "so",
    "cast",
    "ending",
]
FILLER = WORDS[2:]


def write_hf_bert(
    directory: Path,
    dropout: float = 0.1,
    num_labels: int = 0,
    hidden_size: int = 32,
    intermediate_size: int = 64,
    num_heads: int = 4,
) -> Path:
    """A tiny random BertModel written by save_pretrained, with a WordPiece vocab.txt; with
    num_labels, a BertForSequenceClassification (pooler and classifier included)."""
    from transformers import BertConfig, BertForSequenceClassification, BertModel

    torch.manual_seed(0)
    vocab = [*SPECIAL_TOKENS, *WORDS]
    config = BertConfig(
        vocab_size=len(vocab),
        hidden_size=hidden_size,
        num_hidden_layers=2,
        num_attention_heads=num_heads,
        intermediate_size=intermediate_size,
        max_position_embeddings=64,
        hidden_dropout_prob=dropout,
        attention_probs_dropout_prob=dropout,
        num_labels=num_labels or 2,  # BertConfig's default when it has no head
    )
    (BertForSequenceClassification if num_labels else BertModel)(config).save_pretrained(directory)
    (directory / "vocab.txt").write_text("\n".join(vocab) + "\n")
    return directory


def sentiment_rows(n: int, seed: int) -> list[tuple[str, str, str]]:
    """Label 1 iff the sentence holds "good" (else "bad"), among 4-10 filler words."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        words = rng.choices(FILLER, k=rng.randint(4, 10))
        label = rng.randint(0, 1)
        words.insert(rng.randrange(len(words) + 1), "good" if label else "bad")
        rows.append((" ".join(words), "", str(label)))
    return rows


def write_sst2(root: Path, train: int = 256, dev: int = 64) -> Path:
    write_glue_file(root, "SST-2", "train", sentiment_rows(train, 1))
    write_glue_file(root, "SST-2", "dev", sentiment_rows(dev, 2))
    test = root / "SST-2" / "test.tsv"
    test.write_text(
        "index\tsentence\n"
        + "".join(f"{i}\t{s}\n" for i, (s, _, _) in enumerate(sentiment_rows(10, 3)))
    )
    return root


def _cli(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    return run_script("tpformer.cli.finetune", args, cwd=cwd, env=env, timeout=600)


@pytest.mark.slow
def test_tp2_finetune_learns_a_synthetic_task(tmp_path: Path) -> None:
    hf = write_hf_bert(tmp_path / "hf")
    glue = write_sst2(tmp_path / "glue")
    run = tmp_path / "run"
    _, finetune = arguments(  # docs/finetuning.md's (and README's) command, with this test's files
        documented("tpformer-finetune task=sst2 init=path/to/bert data.glue_dir=glue parallel."
                   "tensor=2 launcher"),
        {"path/to/bert": str(hf), "data.glue_dir=glue": f"data.glue_dir={glue}"},
    )  # fmt: skip
    result = _cli(
        [
            *finetune,
            f"data.cache_dir={tmp_path}",
            "optim.lr=2e-3",
            "trainer.epochs=4",
            "trainer.batch_size=16",
            "trainer.progress=false",
            "data.group_by_length=true",
            f"hydra.run.dir={run}",
        ],
        tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    results = json.loads((run / "results.json").read_text())
    assert len(results["evaluations"]) == 4
    assert results["best"]["accuracy"] >= 0.9, results
    lines = (run / "predictions" / "SST-2.tsv").read_text().splitlines()
    assert lines[0] == "index\tprediction" and len(lines) == 11
    assert {line.split("\t")[1] for line in lines[1:]} <= {"0", "1"}
    best = run / "best" / f"step{results['best']['step']:08d}"
    assert (best / "meta.json").is_file() and (best / "tokenizer" / "vocab.txt").is_file()
    # the one loop's reporting: train and dev lines, TensorBoard events, the plot
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    evals = [x for x in lines if x.get("eval")]
    assert [e["accuracy"] for e in evals] == [e["accuracy"] for e in results["evaluations"]]
    assert {"loss", "lr", "grad_norm", "tokens_per_s", "epoch", "pad_fraction"} <= set(lines[0])
    assert any((run / "tensorboard").iterdir())
    assert (run / "loss_curve.png").stat().st_size > 1000
    # export the best checkpoint; transformers loads it and predicts what tpformer wrote
    from transformers import AutoTokenizer, BertForSequenceClassification

    hf_out = tmp_path / "exported"
    exported = subprocess.run(
        [
            sys.executable,
            str(REPO / "tools" / "convert_checkpoint.py"),  # "the same command" (docs/hf.md)
            *arguments(
                documented("tpformer-convert to-hf runs/sst2/best/step00000630 hf/bert-sst2"),
                {"runs/sst2/best/step00000630": str(best), "hf/bert-sst2": str(hf_out)},
            )[1],
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        timeout=300,
    )
    assert exported.returncode == 0, exported.stderr[-2000:]
    model, info = BertForSequenceClassification.from_pretrained(hf_out, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    assert model.config.id2label == {0: "0", 1: "1"}
    tokenizer = AutoTokenizer.from_pretrained(hf_out)
    test_rows = [
        line.split("\t")[1] for line in (glue / "SST-2" / "test.tsv").read_text().splitlines()[1:]
    ]
    with torch.no_grad():
        logits = model.eval()(**tokenizer(test_rows, padding=True, return_tensors="pt")).logits
    ours = [line.split("\t")[1] for line in lines_of(run / "predictions" / "SST-2.tsv")[1:]]
    assert [model.config.id2label[int(i)] for i in logits.argmax(-1)] == ours


def lines_of(path: Path) -> list[str]:
    return path.read_text().splitlines()


def _predictions(ctx: ParallelContext, config: FinetuneConfig, run_dir: str) -> tuple:
    trainer = finetuning_trainer(config, ctx, Path(run_dir))
    records = trainer.train()
    with trainer.engine.gathered():
        trainer.model.eval()
        pred, _ = trainer.task.evaluator.predictor.predict("dev")
    return pred, [r["loss"] for r in records]


@pytest.mark.sweep
@pytest.mark.parametrize(
    ("tp", "dp", "sp", "pp"),
    [(2, 1, False, 1), (1, 2, False, 1), (2, 1, True, 1), (1, 1, False, 2)],
)
def test_same_dev_predictions_at_every_layout(
    tmp_path: Path, tp: int, dp: int, sp: bool, pp: int
) -> None:
    """RTE-style sentence pairs, dropout 0.1 (layout-independent masks), 2 epochs. Sequence
    parallelism pads each batch to a multiple of tensor by itself; the TP=1 reference is told
    to pad the same way (data.pad_to_multiple_of), so the attention dropout masks match. The
    pipeline (2 stages, 4 micro-batches of variable width per step) predicts from its last
    stage."""
    hf = write_hf_bert(tmp_path / "hf")
    rows = [
        (a, b, "entailment" if label == "1" else "not_entailment")
        for (a, _, label), (b, _, _) in zip(sentiment_rows(48, 4), sentiment_rows(48, 5))
    ]
    write_glue_file(tmp_path / "glue", "RTE", "train", rows[:32])
    write_glue_file(tmp_path / "glue", "RTE", "dev", rows[32:])
    config = FinetuneConfig(
        task="rte",
        init=str(hf),
        data=GlueDataConfig(glue_dir=str(tmp_path / "glue"), cache_dir=str(tmp_path / "cache")),
        optim=OptimConfig(lr=1e-3, warmup_steps=2),
        trainer=FinetuneTrainerConfig(
            epochs=2, batch_size=8, progress=False, loggers=[], plot=False
        ),
    )
    reference = replace(config, data=replace(config.data, pad_to_multiple_of=2)) if sp else config
    want_pred, want_loss = _predictions(
        ParallelContext.single(device="cpu"), reference, str(tmp_path / "one")
    )
    if pp > 1:
        config = replace(
            config,
            parallel=replace(config.parallel, pipeline=pp),
            trainer=replace(config.trainer, micro_batch_size=2),
        )
    for pred, loss in run_distributed(
        _predictions,
        tp * dp * pp,
        config,
        str(tmp_path / "many"),
        tensor=tp,
        sequence_parallel=sp,
        pipeline=pp,
    ):
        assert torch.equal(pred, want_pred)
        assert loss == pytest.approx(want_loss, rel=1e-5)


def _rte_config(tmp_path: Path, **parallel: object) -> FinetuneConfig:
    """RTE-style sentence pairs from the sentiment rows: 32 train, 16 dev, dropout 0.1."""
    rows = [
        (a, b, "entailment" if label == "1" else "not_entailment")
        for (a, _, label), (b, _, _) in zip(sentiment_rows(48, 4), sentiment_rows(48, 5))
    ]
    write_glue_file(tmp_path / "glue", "RTE", "train", rows[:32])
    write_glue_file(tmp_path / "glue", "RTE", "dev", rows[32:])
    return FinetuneConfig(
        task="rte",
        init=str(write_hf_bert(tmp_path / "hf")),
        data=GlueDataConfig(glue_dir=str(tmp_path / "glue"), cache_dir=str(tmp_path / "cache")),
        parallel=ParallelConfig(**parallel),  # type: ignore[arg-type]
        optim=OptimConfig(lr=1e-3, warmup_steps=2),
        trainer=FinetuneTrainerConfig(
            epochs=2, batch_size=8, progress=False, loggers=[], plot=False
        ),
    )


def _dev_after_training(config: FinetuneConfig, run_dir: Path) -> tuple[torch.Tensor, list]:
    trainer = finetuning_trainer(config, ParallelContext.single(device="cpu"), run_dir)
    trainer.train()
    trainer.model.eval()
    with trainer.engine.gathered():
        pred, _ = trainer.task.evaluator.predictor.predict("dev")
    return pred, trainer.evaluations


@pytest.mark.parametrize("mode", ["selective", "full"])
def test_recomputation_gives_the_same_dev_predictions(tmp_path: Path, mode: str) -> None:
    """Fine-tuning reaches activation checkpointing through the one loop (dropout 0.1)."""
    pred, evaluations = _dev_after_training(_rte_config(tmp_path), tmp_path / "none")
    recomputed, recomputed_evals = _dev_after_training(
        _rte_config(tmp_path, recompute=mode), tmp_path / mode
    )
    assert torch.equal(recomputed, pred)
    assert recomputed_evals == evaluations


def test_stopped_and_resumed_finetuning_gives_the_uninterrupted_metrics(tmp_path: Path) -> None:
    """8 steps (2 epochs of 4); stop after step 3 (mid-epoch) and after step 4 (an epoch end,
    evaluated before stopping), resume each: the same evaluations and the same best."""
    _, want = _dev_after_training(_rte_config(tmp_path), tmp_path / "whole")
    for exit_at in (3, 4):
        config = _rte_config(tmp_path)
        config.trainer.exit_at_step, config.trainer.save_every = exit_at, 0
        run = tmp_path / f"stopped{exit_at}"
        _first, first_evals = _dev_after_training(config, run)
        assert first_evals == want[: exit_at // 4]
        config.trainer.exit_at_step, config.trainer.resume = 0, "auto"
        _pred, evaluations = _dev_after_training(config, run)
        assert evaluations == want, (exit_at, evaluations, want)
    best_steps = sorted(p.name for p in (tmp_path / "whole" / "best").glob("step*"))
    assert sorted(p.name for p in (run / "best").glob("step*")) == best_steps


def _export_regression(ctx: ParallelContext, config: FinetuneConfig, run_dir: str) -> list:
    trainer = finetuning_trainer(config, ctx, Path(run_dir))
    trainer.train()
    trainer.model.eval()
    with trainer.engine.gathered():
        pred, _ = trainer.task.evaluator.predictor.predict("dev")
    return pred.tolist()


@pytest.mark.slow  # over 5 s (the quick tier leaves single cases that long to the full run)
def test_regression_export_at_tp2_predicts_like_tpformer(tmp_path: Path) -> None:
    """STS-B at TP=2: to-hf writes a regression BertForSequenceClassification whose dev scores
    equal tpformer's (fp32, summed in another order across TP ranks: 1e-5 relative), and so do
    the test predictions the run wrote with its best checkpoint (made without dropout; the
    file's 3 decimals)."""
    from transformers import BertForSequenceClassification

    from tpformer.convert import to_hf

    pairs = list(zip(sentiment_rows(40, 6), sentiment_rows(40, 7)))
    rows = [(a, b, f"{(la == lb) * 4 + 0.5:.2f}") for (a, _, la), (b, _, lb) in pairs]
    write_glue_file(tmp_path / "glue", "STS-B", "train", rows[:32])
    write_glue_file(tmp_path / "glue", "STS-B", "dev", rows[32:])
    write_glue_file(tmp_path / "glue", "STS-B", "test", rows[32:])  # its scores are not read
    config = FinetuneConfig(
        task="stsb",
        init=str(write_hf_bert(tmp_path / "hf")),
        data=GlueDataConfig(glue_dir=str(tmp_path / "glue"), cache_dir=str(tmp_path / "cache")),
        optim=OptimConfig(lr=1e-3, warmup_steps=2),
        trainer=FinetuneTrainerConfig(
            epochs=1, batch_size=8, progress=False, loggers=[], plot=False
        ),
    )
    ours = run_distributed(_export_regression, 2, config, str(tmp_path / "run"), tensor=2)[0]
    best = sorted((tmp_path / "run" / "best").glob("step*"))[-1]
    to_hf(best, tmp_path / "hf_out")
    model, info = BertForSequenceClassification.from_pretrained(
        tmp_path / "hf_out", output_loading_info=True
    )
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    assert (model.config.problem_type, model.config.num_labels) == ("regression", 1)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "hf_out")
    dev = [line.split("\t") for line in lines_of(tmp_path / "glue" / "STS-B" / "dev.tsv")[1:]]
    with torch.no_grad():
        batch = tokenizer(
            [r[7] for r in dev], [r[8] for r in dev], padding=True, return_tensors="pt"
        )
        scores = model.eval()(**batch).logits.squeeze(-1)
    assert_rel_close(scores, torch.tensor(ours), FP32_MODEL_REL, "exported STS-B scores")
    written = [
        float(line.split("\t")[1])
        for line in lines_of(tmp_path / "run" / "predictions" / "STS-B.tsv")[1:]
    ]
    assert torch.allclose(torch.tensor(written), scores.clamp(0, 5), rtol=0, atol=1e-3)


@pytest.mark.slow
def test_bad_input_is_named(tmp_path: Path) -> None:
    hf = write_hf_bert(tmp_path / "hf")
    glue = tmp_path / "glue"
    result = _cli(["task=sst5", f"init={hf}", f"data.glue_dir={glue}"], tmp_path)
    assert result.returncode == 2
    assert "error: task=sst5 is not one of cola, sst2, mrpc" in result.stderr
    args = ["task=sst2", f"init={hf}", f"data.glue_dir={glue}", f"data.cache_dir={tmp_path}"]
    result = _cli(args, tmp_path)
    assert result.returncode == 2 and f"data.glue_dir={glue}: no such file" in result.stderr
    glue.mkdir()
    result = _cli(args, tmp_path)
    assert result.returncode == 2 and "SST-2/train.tsv is missing" in result.stderr
    (hf / "vocab.txt").write_text("\n".join([*SPECIAL_TOKENS, "extra"]) + "\n")
    write_sst2(glue, train=8, dev=8)
    result = _cli(
        ["task=sst2", f"init={hf}", f"data.glue_dir={glue}", f"data.cache_dir={tmp_path}"], tmp_path
    )
    assert result.returncode != 0
    assert f"has 6 tokens but model.vocab_size={len(SPECIAL_TOKENS) + len(WORDS)}" in result.stderr


def test_finetune_starts_from_a_pretraining_checkpoint(tmp_path: Path) -> None:
    """Pretrain 2 steps on a corpus, then fine-tune from the checkpoint: the encoder is the
    pretrained one and the checkpoint's sentencepiece tokenizer is used."""
    from tests.train.test_pretrain_corpus import corpus_config
    from tpformer.convert import load_classifier
    from tpformer.train.pretraining import pretraining_trainer

    config = corpus_config(tmp_path, steps=2)
    config.trainer.save_every = 2
    trainer = pretraining_trainer(config, ParallelContext.single(device="cpu"), tmp_path / "pre")
    trainer.train()
    checkpoint = tmp_path / "pre" / "checkpoints" / "step00000002"
    ctx = ParallelContext.single(device="cpu")
    model, tokenizer_dir = load_classifier(checkpoint, ctx, num_labels=2)
    pretrained = dict(trainer.model.bert.named_parameters())
    for name, param in model.bert.named_parameters():
        assert torch.equal(param, pretrained[name]), name
    assert tokenizer_dir == checkpoint / "tokenizer"
    rows = [
        (f"The king loves the crown {'tonight' if i % 2 else 'at dawn'}.", "", str(i % 2))
        for i in range(16)
    ]
    write_glue_file(tmp_path / "glue", "SST-2", "train", rows)
    write_glue_file(tmp_path / "glue", "SST-2", "dev", rows[:8])
    tune = FinetuneConfig(
        task="sst2",
        init=str(checkpoint),
        data=GlueDataConfig(glue_dir=str(tmp_path / "glue"), cache_dir=str(tmp_path / "cache")),
        trainer=FinetuneTrainerConfig(
            epochs=1, batch_size=8, progress=False, loggers=[], plot=False
        ),
    )
    trainer = finetuning_trainer(tune, ctx, tmp_path / "tune")
    trainer.train()
    results = write_results(trainer, tune, 0.0)
    assert results["steps"] == 2 and "accuracy" in results["best"]
    assert (tmp_path / "tune" / "best" / "step00000002" / "tokenizer" / "tokenizer.model").is_file()


def test_nan_dev_metric_is_reported_and_still_checkpointed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """STS-B dev scores that are all equal make Pearson and Spearman NaN: the run warns, counts
    NaN as the worst value, and still keeps the first evaluation's checkpoint and results."""
    import logging

    pairs = list(zip(sentiment_rows(24, 8), sentiment_rows(24, 9)))
    rows = [(a, b, f"{(la == lb) * 4 + 0.5:.2f}") for (a, _, la), (b, _, lb) in pairs]
    write_glue_file(tmp_path / "glue", "STS-B", "train", rows[:16])
    write_glue_file(tmp_path / "glue", "STS-B", "dev", [(a, b, "2.50") for a, b, _ in rows[16:]])
    config = FinetuneConfig(
        task="stsb",
        init=str(write_hf_bert(tmp_path / "hf")),
        data=GlueDataConfig(glue_dir=str(tmp_path / "glue"), cache_dir=str(tmp_path / "cache")),
        trainer=FinetuneTrainerConfig(
            epochs=2, batch_size=8, progress=False, loggers=[], plot=False
        ),
    )
    trainer = finetuning_trainer(config, ParallelContext.single(device="cpu"), tmp_path / "run")
    with caplog.at_level(logging.WARNING):
        trainer.train()
    results = write_results(trainer, config, 0.0)
    assert "pearson, spearman is NaN" in caplog.text
    assert all(e["pearson"] != e["pearson"] for e in results["evaluations"])  # NaN
    assert results["best"]["step"] == 2
    assert (tmp_path / "run" / "best" / "step00000002" / "meta.json").is_file()


def test_best_checkpoint_holds_the_weights_only(tmp_path: Path) -> None:
    """best/ keeps the parameters (what export and predictions need), a third of a resumable
    checkpoint's bytes under AdamW; resuming from it names where a resumable one is."""
    from tpformer.checkpoint import store
    from tpformer.config.schema import FinetuneTrainerConfig as T

    write_sst2(tmp_path / "glue", train=16, dev=8)
    config = FinetuneConfig(
        task="sst2",
        init=str(write_hf_bert(tmp_path / "hf")),
        data=GlueDataConfig(glue_dir=str(tmp_path / "glue"), cache_dir=str(tmp_path / "cache")),
        trainer=T(epochs=1, batch_size=8, progress=False, loggers=[], plot=False, save_every=2),
    )
    ctx = ParallelContext.single(device="cpu")
    trainer = finetuning_trainer(config, ctx, tmp_path / "run")
    start = time.perf_counter()
    trainer.train()
    results = write_results(trainer, config, time.perf_counter() - start)
    spent = results["output_seconds"]  # what the run writes besides training and evaluating
    assert set(spent) == {"checkpoints", "best_outputs", "metrics_close"}, spent
    assert spent["checkpoints"] > 0 and sum(spent.values()) < results["wall_time_s"], results
    best = tmp_path / "run" / "best" / "step00000002"
    full = tmp_path / "run" / "checkpoints" / "step00000002"
    assert store.read_meta(best)["weights_only"] and "weights_only" not in store.read_meta(full)
    sizes = [sum(f.stat().st_size for f in d.glob("__*")) for d in (best, full)]
    assert 0.3 < sizes[0] / sizes[1] < 0.4, sizes
    from torch.distributed.checkpoint import FileSystemReader

    keys = set(FileSystemReader(str(best)).read_metadata().state_dict_metadata)
    assert keys and all(k.startswith("engine.param/") for k in keys), sorted(keys)[:5]
    resumed = finetuning_trainer(
        replace(config, trainer=replace(config.trainer, resume=str(best))), ctx, tmp_path / "again"
    )
    with pytest.raises(store.CheckpointError, match=r"weights only.*trainer.save_every"):
        resumed.train()
