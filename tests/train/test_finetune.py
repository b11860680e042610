"""GLUE fine-tuning: a learnable synthetic task end to end at TP=2 through the CLI, the same dev
predictions at TP=1 and TP=2, results/predictions files, and the errors of bad input."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.data.test_glue import write_glue_file
from tests.dist import run_distributed
from tests.train.test_trainer import REPO
from tpformer.config.schema import FinetuneConfig, FinetuneTrainerConfig, GlueDataConfig, OptimConfig
from tpformer.data.tokenizer import SPECIAL_TOKENS
from tpformer.parallel.context import ParallelContext
from tpformer.train.finetuning import finetuning_trainer, write_results

WORDS = ["good", "bad", "the", "movie", "plot", "was", "acting", "very", "quite", "and", "a", "film",
         "story", "music", "is", "really", "not", "so", "cast", "ending"]
FILLER = WORDS[2:]


def write_hf_bert(directory: Path, dropout: float = 0.1) -> Path:
    """A tiny random BertModel written by save_pretrained, with a WordPiece vocab.txt."""
    from transformers import BertConfig, BertModel

    torch.manual_seed(0)
    vocab = [*SPECIAL_TOKENS, *WORDS]
    config = BertConfig(vocab_size=len(vocab), hidden_size=32, num_hidden_layers=2,
                        num_attention_heads=4, intermediate_size=64, max_position_embeddings=64,
                        hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout)
    BertModel(config).save_pretrained(directory)
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
    test.write_text("index\tsentence\n" + "".join(f"{i}\t{s}\n" for i, (s, _, _) in
                                                 enumerate(sentiment_rows(10, 3))))
    return root


def _cli(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "tpformer.finetune", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)


def test_tp2_finetune_learns_a_synthetic_task(tmp_path: Path) -> None:
    hf = write_hf_bert(tmp_path / "hf")
    glue = write_sst2(tmp_path / "glue")
    run = tmp_path / "run"
    result = _cli(["task=sst2", f"init={hf}", f"data.glue_dir={glue}", f"data.cache_dir={tmp_path}",
                   "parallel.tensor=2", "launcher.nproc_per_node=2", "optim.lr=2e-3",
                   "trainer.epochs=4", "trainer.batch_size=16", "trainer.progress=false",
                   "data.group_by_length=true", f"hydra.run.dir={run}"], tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    results = json.loads((run / "results.json").read_text())
    assert len(results["evaluations"]) == 4
    assert results["best"]["accuracy"] >= 0.9, results
    lines = (run / "predictions" / "SST-2.tsv").read_text().splitlines()
    assert lines[0] == "index\tprediction" and len(lines) == 11
    assert {line.split("\t")[1] for line in lines[1:]} <= {"0", "1"}
    best = run / "best" / f"step{results['best']['step']:08d}"
    assert (best / "meta.json").is_file() and (best / "tokenizer" / "vocab.txt").is_file()


def _predictions(ctx: ParallelContext, config: FinetuneConfig, run_dir: str) -> tuple:
    trainer = finetuning_trainer(config, ctx, Path(run_dir))
    records = trainer.train()
    with trainer.engine.gathered():
        trainer.model.eval()
        pred, _ = trainer.task.evaluator.predictor.predict("dev")
    return pred, [r["loss"] for r in records]


@pytest.mark.parametrize(("tp", "dp"), [(2, 1), (1, 2)])
def test_same_dev_predictions_at_every_layout(tmp_path: Path, tp: int, dp: int) -> None:
    """RTE-style sentence pairs, dropout 0.1 (layout-independent masks), 2 epochs."""
    hf = write_hf_bert(tmp_path / "hf")
    rows = [(a, b, "entailment" if label == "1" else "not_entailment")
            for (a, _, label), (b, _, _) in zip(sentiment_rows(48, 4), sentiment_rows(48, 5))]
    write_glue_file(tmp_path / "glue", "RTE", "train", rows[:32])
    write_glue_file(tmp_path / "glue", "RTE", "dev", rows[32:])
    config = FinetuneConfig(task="rte", init=str(hf),
                            data=GlueDataConfig(glue_dir=str(tmp_path / "glue"),
                                                cache_dir=str(tmp_path / "cache")),
                            optim=OptimConfig(lr=1e-3, warmup_steps=2),
                            trainer=FinetuneTrainerConfig(epochs=2, batch_size=8, progress=False))
    want_pred, want_loss = _predictions(ParallelContext.single(device="cpu"), config,
                                        str(tmp_path / "one"))
    for pred, loss in run_distributed(_predictions, tp * dp, config, str(tmp_path / "many"),
                                      tensor=tp):
        assert torch.equal(pred, want_pred)
        assert loss == pytest.approx(want_loss, rel=1e-5)


def test_bad_input_is_named(tmp_path: Path) -> None:
    hf = write_hf_bert(tmp_path / "hf")
    glue = tmp_path / "glue"
    result = _cli(["task=sst5", f"init={hf}", f"data.glue_dir={glue}"], tmp_path)
    assert result.returncode == 2
    assert "Invalid value 'sst5', expected one of [cola, sst2, mrpc" in result.stderr
    result = _cli(["task=sst2", f"init={hf}", f"data.glue_dir={glue}",
                   f"data.cache_dir={tmp_path}"], tmp_path)
    assert result.returncode != 0 and "SST-2/train.tsv is missing" in result.stderr
    (hf / "vocab.txt").write_text("\n".join([*SPECIAL_TOKENS, "extra"]) + "\n")
    write_sst2(glue, train=8, dev=8)
    result = _cli(["task=sst2", f"init={hf}", f"data.glue_dir={glue}",
                   f"data.cache_dir={tmp_path}"], tmp_path)
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
    rows = [(f"The king loves the crown {'tonight' if i % 2 else 'at dawn'}.", "", str(i % 2))
            for i in range(16)]
    write_glue_file(tmp_path / "glue", "SST-2", "train", rows)
    write_glue_file(tmp_path / "glue", "SST-2", "dev", rows[:8])
    tune = FinetuneConfig(task="sst2", init=str(checkpoint),
                          data=GlueDataConfig(glue_dir=str(tmp_path / "glue"),
                                              cache_dir=str(tmp_path / "cache")),
                          trainer=FinetuneTrainerConfig(epochs=1, batch_size=8, progress=False))
    trainer = finetuning_trainer(tune, ctx, tmp_path / "tune")
    trainer.train()
    results = write_results(trainer, tune, 0.0)
    assert results["steps"] == 2 and "accuracy" in results["best"]
    assert (tmp_path / "tune" / "best" / "step00000002" / "tokenizer" / "tokenizer.model").is_file()
