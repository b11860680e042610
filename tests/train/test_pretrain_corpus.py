"""Pretraining on a real corpus file: tokenizer trained and corpus preprocessed by the trainer,
the same loss curve in every layout, convergence, the tokenizer saved with checkpoints, and the
errors a user meets first."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.data.common import write_corpus
from tests.dist import run_distributed
from tests.docs.commands import arguments, documented
from tests.tolerances import FP32_MODEL_REL
from tests.train.test_trainer import QUIET, _cli, tiny_config
from tpformer.config.presets import preset
from tpformer.config.schema import Config, DataConfig, LocalAttentionConfig, SentencePairs
from tpformer.convert import to_hf
from tpformer.data.tokenizer import Tokenizer
from tpformer.parallel.context import ParallelContext
from tpformer.parallel.layout import Layout
from tpformer.train.pretraining import pretraining_trainer
from tpformer.train.startup_report import format_plan

VOCAB = 160


def corpus_config(root: Path, steps: int = 4, micro: int = 4, accum: int = 1, **parallel) -> Config:
    config = tiny_config(steps=steps, micro=micro, accum=accum, **parallel)
    corpus = root / "corpus.txt"
    if not corpus.exists():
        write_corpus(corpus, documents=40)
    config.model.vocab_size = VOCAB
    config.data = DataConfig(
        source="text", paths=[str(corpus)], seq_length=32, cache_dir=str(root / "cache"), workers=1
    )
    return config


def _losses(ctx: ParallelContext, config: Config, run_dir: str) -> list[float]:
    return [r["loss"] for r in pretraining_trainer(config, ctx, Path(run_dir)).train()]


@pytest.mark.sweep
@pytest.mark.parametrize(("tp", "dp", "accum"), [(2, 1, 1), (1, 2, 1), (1, 1, 2)])
def test_corpus_loss_curve_is_the_same_in_every_layout(
    tmp_path: Path, tp: int, dp: int, accum: int
) -> None:
    """Global batch 8: 8 x 1 x 1 vs 8 at tp 2, 4 x 2 ranks, 4 x 2 micro-batches (dropout 0.1)."""
    reference = _losses(
        ParallelContext.single(device="cpu"),
        corpus_config(tmp_path, micro=8),
        str(tmp_path / "ref"),
    )
    config = corpus_config(tmp_path, micro=8 // (dp * accum), accum=accum, tensor=tp)
    for losses in run_distributed(_losses, tp * dp, config, str(tmp_path / "run"), tensor=tp):
        assert len(losses) == len(reference)
        for got, want in zip(losses, reference):
            assert abs(got - want) <= FP32_MODEL_REL * abs(want), (losses, reference)


@pytest.mark.slow
def test_mlm_loss_halves_on_a_tiny_corpus(tmp_path: Path) -> None:
    """bert_tiny, 300 steps of 16 x 64 tokens; the checkpoint carries the trained tokenizer."""
    config = corpus_config(tmp_path, steps=300, micro=16)
    config.data.seq_length = 64
    config.optim.warmup_steps, config.optim.lr = 20, 2e-3
    config.trainer.log_every = 20
    config.trainer.save_every = 300
    records = pretraining_trainer(
        config, ParallelContext.single(device="cpu"), tmp_path / "run"
    ).train()
    mlm = [r["mlm_loss"] for r in records]
    assert mlm[0] > 4.0, mlm  # starts near ln(160) = 5.08
    assert mlm[-1] < 0.5 * mlm[0], mlm
    checkpoint = tmp_path / "run" / "checkpoints" / "step00000300"
    saved = Tokenizer(checkpoint / "tokenizer")
    assert saved.vocab_size == VOCAB
    hf = to_hf(checkpoint, tmp_path / "hf")
    assert Tokenizer(hf).fingerprint() == saved.fingerprint()
    assert json.loads((hf / "config.json").read_text())["vocab_size"] == VOCAB


def test_tokenizer_vocabulary_must_match_the_model(tmp_path: Path) -> None:
    config = corpus_config(tmp_path)
    pretraining_trainer(
        config, ParallelContext.single(device="cpu"), tmp_path / "a"
    )  # trains the tokenizer
    tokenizer = next((tmp_path / "cache").glob("tokenizer-*/tokenizer.model"))
    config.data.tokenizer = str(tokenizer)
    config.model.vocab_size = 256
    with pytest.raises(
        ValueError,
        match=rf"has {VOCAB} tokens but model.vocab_size=256; set "
        rf"model.vocab_size={VOCAB}",
    ):
        pretraining_trainer(config, ParallelContext.single(device="cpu"), tmp_path / "b")


@pytest.mark.slow
def test_cli_on_a_text_corpus_and_its_errors(tmp_path: Path) -> None:
    corpus = write_corpus(tmp_path / "corpus.txt", documents=12)
    common = [
        "model=bert_tiny",
        "model.num_heads=4",
        f"model.vocab_size={VOCAB}",
        "data=text",
        f"data.paths=[{corpus}]",
        "data.seq_length=32",
        f"data.cache_dir={tmp_path / 'c'}",
        "trainer.micro_batch_size=4",
        "trainer.progress=false",
        *QUIET,
        "trainer.max_steps=2",
    ]
    result = _cli([*common, "parallel.tensor=2", "launcher.nproc_per_node=2"], tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "corpus: 12 documents" in result.stderr
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"fine\n\xff\xfe oops\n")
    result = _cli(
        [*common[:4], f"data.paths=[{bad}]", *common[5:], "launcher.nproc_per_node=2"], tmp_path
    )
    assert result.returncode != 0
    assert "bad.txt is not UTF-8: byte 0xff at byte offset 5" in result.stderr, result.stderr[
        -3000:
    ]


def _packed_config(root: Path, family: str, micro: int, accum: int, **parallel) -> Config:
    """Documents of three sentences (~25 tokens) packed into 32-token sequences: most hold
    pieces of two documents. ModernBERT with a window of 8 (layers 0 and 3 global), Llama with
    two key/value heads; dropout 0.1 in both, drawn by the TP=1 model's masks (rng=exact)."""
    corpus = root / "corpus.txt"
    if not corpus.exists():
        write_corpus(corpus, documents=40, sentences=3)
    config = corpus_config(root, micro=micro, accum=accum, **parallel)
    variant: dict[str, object] = (
        {"local_attention": LocalAttentionConfig(window=8, global_every=3)}
        if family == "modernbert_tiny"
        else {"num_kv_heads": 2}
    )
    config.model = preset(
        family, vocab_size=VOCAB, hidden_size=32, num_heads=4, intermediate_size=64,
        num_layers=4, max_position_embeddings=64, dropout=0.1, attention_dropout=0.1, **variant,
    )  # fmt: skip
    config.data.pack, config.data.sentence_pairs = True, SentencePairs.none
    return config


@pytest.mark.sweep
@pytest.mark.parametrize(
    ("family", "layout", "engine"),
    [
        ("modernbert_tiny", {"pipeline": 2}, {}),
        ("llama_tiny", {"tensor": 2, "sequence_parallel": True}, {"recompute": "full"}),
        ("modernbert_tiny", {"tensor": 2, "sequence_parallel": True}, {}),
        ("llama_tiny", {"pipeline": 2}, {}),
        ("modernbert_tiny", {"data": 2}, {"zero_stage": 3, "recompute": "selective"}),
    ],
)
def test_packed_corpus_loss_curve_is_the_same_in_every_layout(
    tmp_path: Path, family: str, layout: dict, engine: dict
) -> None:
    """data.pack through the trainer (packed samples, document masks, positions restarting,
    GPT's targets across document starts ignored) at pipeline=2 (2 micro-batches of 2), TP=2 +
    SP (one of 4) and DP=2 with ZeRO-3 (2 a rank), with recomputation, against one process (one
    micro-batch of 4), to FP32_MODEL_REL a step."""
    reference = _losses(
        ParallelContext.single(device="cpu"),
        _packed_config(tmp_path, family, micro=4, accum=1),
        str(tmp_path / "ref"),
    )
    piped = layout.get("pipeline", 1) > 1
    micro = 4 // (2 if piped else layout.get("data", 1))
    keys = {k: v for k, v in layout.items() if k != "data"}  # the world gives DP its size
    config = _packed_config(tmp_path, family, micro, 2 if piped else 1, **keys, **engine)
    for losses in run_distributed(_losses, 2, config, str(tmp_path / "run"), **layout):
        assert len(losses) == len(reference)
        for got, want in zip(losses, reference):
            assert abs(got - want) <= FP32_MODEL_REL * abs(want), (losses, reference)


def test_the_startup_plan_says_documents_are_packed(tmp_path: Path) -> None:
    config = _packed_config(tmp_path, "llama_tiny", micro=4, accum=1)
    plan, _ = format_plan(config, Layout(dp=1, tp=1), [1], 1, [])
    assert "seq 32; documents packed (each attends within itself" in plan
    config.data.pack = False
    assert "packed" not in format_plan(config, Layout(dp=1, tp=1), [1], 1, [])[0]


@pytest.mark.slow
def test_docs_packing_command_runs_from_the_command_line(tmp_path: Path) -> None:
    """docs/data.md's `tpformer-pretrain model=modernbert_tiny data.pack=true`, at tiny sizes
    (overrides: a 2-layer, 64-wide model of VOCAB tokens on a test corpus of short documents,
    32-token sequences, 3 steps): exit 0, the plan says documents are packed, training
    batches (nearly) unpadded."""
    corpus = write_corpus(tmp_path / "corpus.txt", documents=40, sentences=3)
    _, argv = arguments(  # docs/data.md's command, its 20 steps cut to 3
        documented("tpformer-pretrain model=modernbert_tiny data.pack=true"),
        {"trainer.max_steps=20": "trainer.max_steps=3"},
    )
    result = _cli(
        [
            *argv,
            "model.num_layers=2", "model.hidden_size=64", "model.intermediate_size=128",
            f"model.vocab_size={VOCAB}", "data=text", f"data.paths=[{corpus}]",
            "data.seq_length=32", f"data.cache_dir={tmp_path / 'c'}",
            "trainer.micro_batch_size=4", "trainer.log_every=1", "trainer.progress=false",
            *QUIET,
        ],
        tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert "documents packed (each attends within itself" in result.stderr
    metrics = next(tmp_path.glob("outputs/*/*/metrics.jsonl")).read_text().splitlines()
    rows = [json.loads(line) for line in metrics]
    assert [r["step"] for r in rows if "loss" in r][:3] == [1, 2, 3]
    train = [r["pad_fraction"] for r in rows if "pad_fraction" in r and not r.get("eval")]
    assert train and max(train) < 0.05, rows  # (the held-out split is one short document)
