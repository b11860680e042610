"""Weighted blends of corpora: proportions within binomial error, every corpus's samples drawn in
its own order without gaps or repeats, the order a function of the global index (so a resume on
a smaller world continues it), held-out loss per corpus, and the errors a user meets."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from tests.data.common import corpus_tokenizer, write_corpus
from tests.dist import run_distributed
from tests.tolerances import FP32_MODEL_REL
from tests.train.test_trainer import tiny_config
from tpformer.checkpoint import store
from tpformer.config.overrides import check_overrides
from tpformer.config.rules.data import validate_data
from tpformer.config.schema import BlendPart, Config, DataConfig
from tpformer.config.validate import validate
from tpformer.data.blend import BlendSchedule
from tpformer.data.corpus import read_text, split_sentences
from tpformer.parallel.context import ParallelContext
from tpformer.train.pretraining import pretraining_trainer

WEIGHTS = [0.5, 0.3, 0.2]


def _within_binomial_error(counts: np.ndarray, weights: list[float]) -> None:
    n, share = counts.sum(), np.asarray(weights) / sum(weights)
    sigma = np.sqrt(n * share * (1 - share))
    assert np.all(np.abs(counts - n * share) <= 3 * sigma), (counts, n * share, sigma)


@pytest.mark.parametrize("seed", [0, 1234])
def test_blend_proportions_match_the_weights_within_binomial_error(seed: int) -> None:
    """A run of 40,000 samples and its first step of 64: each corpus's share within three
    binomial standard deviations; each corpus's own samples 0..n-1, each exactly once."""
    schedule = BlendSchedule(WEIGHTS, seed)
    corpus, own = schedule(range(40_000))
    counts = np.bincount(corpus, minlength=3)
    _within_binomial_error(counts, WEIGHTS)
    _within_binomial_error(np.bincount(corpus[:64], minlength=3), WEIGHTS)
    print(f"seed {seed}: shares {counts / counts.sum()} (weights {WEIGHTS})")
    for k in range(3):
        assert np.array_equal(np.sort(own[corpus == k]), np.arange(counts[k]))
    other, _ = BlendSchedule(WEIGHTS, seed + 1)(range(64))
    assert not np.array_equal(other, corpus[:64])  # the seed shuffles the order


def test_blend_order_is_a_function_of_the_global_index() -> None:
    """Read in any pieces and any order (another DP rank's slice, a resumed step, a second
    process), sample g is the same (corpus, own index)."""
    whole = BlendSchedule([7, 3], 5)(range(20_000))
    fresh = BlendSchedule([7, 3], 5)
    for start, stop in [(12_000, 12_064), (3, 19), (0, 4096), (8190, 8200)]:
        corpus, own = fresh(range(start, stop))
        assert np.array_equal(corpus, whole[0][start:stop])
        assert np.array_equal(own, whole[1][start:stop])


def test_a_rare_corpus_is_still_drawn() -> None:
    """A weight of 1 in 10,000 widens the block, so its count never goes negative."""
    corpus, _ = BlendSchedule([1.0, 1e-4], 0)(range(100_000))
    assert 8 <= np.bincount(corpus)[1] <= 12


@pytest.fixture(scope="module")
def two_corpora(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """A text corpus and a Megatron-LM dataset written by megatron-core from another corpus,
    both in one tokenizer's ids."""
    megatron = pytest.importorskip("megatron.core.datasets.indexed_dataset")
    root = tmp_path_factory.mktemp("blend")
    plays = write_corpus(root / "plays.txt", documents=30)
    letters = write_corpus(root / "letters.txt", documents=30, seed=9)
    tok = corpus_tokenizer(plays, root / "tok")
    builder = megatron.IndexedDatasetBuilder(str(root / "letters.bin"), dtype=np.uint16)
    import torch

    for document in read_text((str(letters),)):
        for sentence in tok.encode(split_sentences(document)):
            builder.add_item(torch.tensor(sentence))
        builder.end_document()
    builder.finalize(str(root / "letters.idx"))
    return plays, root / "letters", tok.path


def blend_config(root: Path, corpora: tuple[Path, Path, Path], **trainer) -> Config:
    plays, letters, tokenizer = corpora
    config = tiny_config(steps=4, micro=4, zero_stage=1)
    config.model.vocab_size = 160
    config.data = DataConfig(
        blend=[
            BlendPart(source="text", paths=[str(plays)], weight=0.7),
            BlendPart(source="megatron", paths=[str(letters)], weight=0.3, label="letters"),
        ],
        tokenizer=str(tokenizer),
        seq_length=32,
        cache_dir=str(root / "cache"),
        workers=1,
    )
    return replace(
        config, trainer=replace(config.trainer, global_batch_size=8, eval_every=2, **trainer)
    )


def _train(ctx: ParallelContext, config: Config, run_dir: str) -> tuple[dict, list[dict]]:
    validate(config, ctx.layout)
    trainer = pretraining_trainer(config, ctx, Path(run_dir))
    return {r["step"]: r["loss"] for r in trainer.train()}, trainer.evaluations


@pytest.mark.slow  # over ~5 s: the slow tier
def test_a_blended_run_resumed_on_a_smaller_world_continues_its_curve(
    tmp_path: Path, two_corpora: tuple[Path, Path, Path]
) -> None:
    """BERT on 0.7 text + 0.3 Megatron, global batch 8: two DP ranks (ZeRO-1) stop at step 2;
    one process resumes (2 micro-batches) and trains steps 3-4 on the uninterrupted run's
    samples: the same losses within 1e-5. Evaluation reports each corpus and their weighted
    mean."""
    config = blend_config(tmp_path, two_corpora)
    (straight, evaluations), _ = run_distributed(_train, 2, config, str(tmp_path / "a"))
    stopped = blend_config(tmp_path, two_corpora, exit_at_step=2)
    run_distributed(_train, 2, stopped, str(tmp_path / "b"))
    checkpoint = tmp_path / "b" / "checkpoints" / store.step_dir_name(2)
    resumed = blend_config(tmp_path, two_corpora, resume=str(checkpoint))
    losses, _ = _train(ParallelContext.single(device="cpu"), resumed, str(tmp_path / "c"))
    assert sorted(losses) == [3, 4]
    for step in (3, 4):
        assert abs(losses[step] - straight[step]) <= FP32_MODEL_REL * straight[step]
    last = evaluations[-1]
    assert {"loss", "plays/loss", "letters/loss", "plays/mlm_loss"} <= set(last)
    assert last["plays/loss"] != last["letters/loss"]
    mean = 0.7 * last["plays/loss"] + 0.3 * last["letters/loss"]
    assert abs(last["loss"] - mean) <= 1e-6 * mean


def test_blend_mistakes_are_named() -> None:
    with pytest.raises(ValueError, match=r"data\.blend\[1\]\.wieght is not a config key; did"):
        check_overrides(["data.blend=[{source:text,paths:[a]},{source:text,wieght:2}]"], Config)
    with pytest.raises(ValueError, match=r"data\.blend\[0\]\.source=txt is not one of"):
        check_overrides(["data.blend=[{source:txt,paths:[a]}]"], Config)
    text = BlendPart(source="text", paths=["a.txt"])
    cases = {
        "data.blend replaces data.source and data.paths": DataConfig(paths=["x"], blend=[text]),
        r"data\.blend\[1\]\.source=megatron holds token ids already: set data\.tokenizer": (
            DataConfig(blend=[text, BlendPart(source="megatron", paths=["m"])])
        ),
        r"data\.blend\[0\]\.source=jsonl needs data\.blend\[0\]\.paths": DataConfig(
            blend=[BlendPart(source="jsonl")]
        ),
        r"data\.blend\[0\]\.weight=0 must be": DataConfig(blend=[replace(text, weight=0)]),
        r"data\.blend\[1\]\.source=synthetic cannot be blended": DataConfig(
            blend=[text, BlendPart(source="synthetic")]
        ),
        r"labels \['a', 'a'\] must differ": DataConfig(
            blend=[replace(text, label="a"), replace(text, label="a")]
        ),
        r"data\.documents=file applies to source=text": DataConfig(
            source="jsonl", paths=["a"], documents="file"
        ),
        r"data\.source=megatron needs data\.paths=\[prefix\]": DataConfig(
            source="megatron", paths=["a", "b"], tokenizer="t"
        ),
    }
    for message, data in cases.items():
        with pytest.raises(ValueError, match=message):
            validate_data(data)
