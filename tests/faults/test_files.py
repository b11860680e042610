"""Faults of files, staged for real: damaged checkpoints (truncated or flipped shards, empty or
garbled meta.json, a lost .metadata), a real write failure (RLIMIT_FSIZE, as a full disk), damaged
preprocessed corpora and token ids outside the vocabulary. Nothing is mocked: the files are
written by real runs and then damaged on disk."""

from __future__ import annotations

import logging
import resource
import signal
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from tests.data.common import write_corpus
from tests.dist import run_distributed
from tests.faults.job import REPO, TINY
from tests.train.test_trainer import tiny_config
from tpformer.checkpoint import store
from tpformer.config.schema import Config, DataConfig
from tpformer.data import prepare_data
from tpformer.data.indexed import IndexedCorpus
from tpformer.parallel.context import ParallelContext
from tpformer.train.pretraining import pretraining_trainer

pytestmark = pytest.mark.slow


def _train(config: Config, run_dir: Path, **trainer: object) -> dict[int, float]:
    config.trainer = replace(config.trainer, **trainer)  # type: ignore[arg-type]
    ctx = ParallelContext.single(device="cpu")
    return {r["step"]: r["loss"] for r in pretraining_trainer(config, ctx, run_dir).train()}


def _shard(checkpoint: Path) -> Path:
    return sorted(checkpoint.glob("__0_*.distcp"))[0]


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    for i in range(len(data) // 2, len(data) // 2 + 64):
        data[i] ^= 0xFF
    path.write_bytes(bytes(data))


DAMAGE = {
    "truncated shard": (_shard, _truncate, "bytes but .* were written"),
    "flipped bytes in a shard": (_shard, _flip, "does not match the checksum"),
    "empty meta.json": (
        lambda c: c / "meta.json",
        lambda p: p.write_text(""),
        "meta.json is unreadable",
    ),
    "garbled meta.json": (
        lambda c: c / "meta.json",
        lambda p: p.write_text('{"step": 4,'),
        "meta.json is unreadable",
    ),
    "lost .metadata": (lambda c: c / ".metadata", lambda p: p.unlink(), ".metadata is missing"),
}


@pytest.mark.parametrize("kind", sorted(DAMAGE))
def test_damaged_latest_checkpoint_falls_back_or_stops(
    tmp_path: Path, kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    """resume=auto skips the damaged newest checkpoint with a warning naming the file and
    resumes from the previous one (the losses of the uninterrupted run); an explicit resume of
    the damaged one stops with the file named."""
    want = _train(tiny_config(steps=6), tmp_path / "straight")
    _train(tiny_config(steps=6), tmp_path / "run", save_every=2, exit_at_step=4)
    root = tmp_path / "run" / "checkpoints"
    pick, damage, message = DAMAGE[kind]
    target = pick(root / "step00000004")
    damage(target)
    with caplog.at_level(logging.WARNING):
        resumed = _train(tiny_config(steps=6), tmp_path / "run", save_every=0, resume="auto")
    assert "skipping step00000004" in caplog.text and target.name in caplog.text
    assert min(resumed) == 3 and resumed == {s: want[s] for s in resumed}
    with pytest.raises(store.CheckpointError, match=message):
        _train(tiny_config(steps=6), tmp_path / "explicit", resume=str(root / "step00000004"))


def test_unverified_truncated_shard_names_the_checkpoint(tmp_path: Path) -> None:
    _train(tiny_config(steps=2), tmp_path / "run", save_every=2)
    checkpoint = tmp_path / "run" / "checkpoints" / "step00000002"
    _truncate(_shard(checkpoint))
    with pytest.raises(store.CheckpointError, match=rf"reading the checkpoint {checkpoint} failed"):
        _train(
            tiny_config(steps=4),
            tmp_path / "again",
            resume=str(checkpoint),
            verify_checkpoint=False,
        )


def test_damaged_checkpoint_at_the_cli_is_one_line(tmp_path: Path) -> None:
    """Through the launcher on 2 ranks: exit 1 and one line, printed once by the launcher,
    naming the file and the ranks that met it; no traceback, no launcher lines of torch's.
    (A truncated file is refused before any rank starts: tests/cli/test_bad_input.py.)"""
    _train(tiny_config(steps=2), tmp_path / "run", save_every=2)
    checkpoint = tmp_path / "run" / "checkpoints" / "step00000002"
    _flip(_shard(checkpoint))
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "tpformer.cli.pretrain",
            *TINY,
            "trainer.max_steps=4",
            f"trainer.resume={checkpoint}",
            "launcher.nproc_per_node=2",
            f"hydra.run.dir={tmp_path / 'cli'}",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={"PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"},
    )
    assert result.returncode == 1
    named = [line for line in result.stderr.splitlines() if "does not match the checksum" in line]
    assert len(named) == 1 and "__0_0.distcp" in named[0], result.stderr
    assert named[0].startswith("error: ") and named[0].endswith("(ranks 0, 1)"), named
    assert "Traceback" not in result.stderr and "torch/distributed" not in result.stderr
    assert "does not match the checksum" in (tmp_path / "cli" / "train.log").read_text()


def _write_fails_past(
    ctx: ParallelContext, config: Config, run_dir: str, limit: int, steps: int = 4
) -> str:
    """Save step 2, then make this process unable to write files past `limit` bytes (as a full
    disk: EFBIG instead of SIGXFSZ) and train on to the next save."""
    _train_ranked(ctx, config, run_dir, save_every=2)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))
    try:
        _train_ranked(
            ctx,
            replace(config, trainer=replace(config.trainer, max_steps=steps)),
            run_dir,
            save_every=2,
            resume="auto",
        )
    except OSError as err:
        return str(err)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    return "no error"


def _train_ranked(ctx: ParallelContext, config: Config, run_dir: str, **trainer: object) -> None:
    config = replace(config, trainer=replace(config.trainer, **trainer))  # type: ignore[arg-type]
    pretraining_trainer(config, ctx, Path(run_dir)).train()


def test_real_write_failure_keeps_the_previous_checkpoint(tmp_path: Path) -> None:
    """2 ranks, every shard larger than the file-size limit: DCP's CheckpointException reaches
    every rank as one OSError, the temporary directory is removed, step 2 stays latest."""
    messages = run_distributed(_write_fails_past, 2, tiny_config(steps=2), str(tmp_path), 64_000)
    for message in messages:
        assert "saving the checkpoint of step 4" in message, message
        assert "previous checkpoints" in message and "intact" in message
    root = tmp_path / "checkpoints"
    assert store.find_latest(root) == root / "step00000002"
    assert store.verify(root / "step00000002")["step"] == 2
    assert not list(root.glob(".tmp-step*"))


@pytest.mark.slow
def test_background_write_failure_stops_the_run_before_its_end(tmp_path: Path) -> None:
    """trainer.async_save: the save of step 4 fails in the background while steps 5-8 train;
    every rank raises it (at a later step's agreement or the next save), not only at the end."""
    messages = run_distributed(_write_fails_past, 2, tiny_config(steps=2), str(tmp_path), 64_000, 8)
    for message in messages:
        assert "saving the checkpoint of step 4" in message, message
        assert f"{tmp_path / 'checkpoints'}" in message and "intact" in message
    root = tmp_path / "checkpoints"
    assert store.find_latest(root) == root / "step00000002"
    assert not (root / "step00000006").exists() and not (root / "step00000008").exists()


@pytest.fixture()
def corpus(tmp_path: Path) -> tuple[DataConfig, Path]:
    data = DataConfig(
        source="text",
        paths=[str(write_corpus(tmp_path / "c.txt", documents=12))],
        cache_dir=str(tmp_path / "cache"),
        workers=1,
        seq_length=32,
    )
    _, (prefix,) = prepare_data(data, 160, progress=False)
    return data, prefix


CORPUS_DAMAGE = {
    "truncated token file": (".bin", _truncate, "has .* bytes, its index expects"),
    "garbled corpus json": (
        ".json",
        lambda p: p.write_text("{"),
        "is unreadable .*JSONDecodeError",
    ),
    "corrupt index": (".sentences.npy", _flip, "is unreadable"),
    "truncated index": (".documents.npy", _truncate, "is unreadable"),
}


@pytest.mark.parametrize("kind", sorted(CORPUS_DAMAGE))
def test_damaged_corpus_files_fail_clearly(corpus: tuple[DataConfig, Path], kind: str) -> None:
    _, prefix = corpus
    suffix, damage, message = CORPUS_DAMAGE[kind]
    damage(Path(f"{prefix}{suffix}"))
    with pytest.raises(ValueError, match=message):
        IndexedCorpus(prefix)


def test_token_ids_outside_the_vocabulary_are_named(corpus: tuple[DataConfig, Path]) -> None:
    _, prefix = corpus
    tokens = np.memmap(f"{prefix}.bin", dtype=IndexedCorpus(prefix).tokens.dtype, mode="r+")
    tokens[17] = 999
    tokens.flush()
    with pytest.raises(
        ValueError, match=r"token id 999 at position 17, outside model.vocab_size=160"
    ):
        IndexedCorpus(prefix).check_token_ids(160)


def _stop_for_time(ctx: ParallelContext, run_dir: str) -> tuple[int, int | None]:
    """A run far longer than its time limit, checkpointing on (save_every past the stop)."""
    config = tiny_config(steps=100_000)
    config.trainer = replace(
        config.trainer, max_time_minutes=0.02, save_every=50_000, log_every=1_000
    )
    records = pretraining_trainer(config, ctx, Path(run_dir)).train()
    latest = store.find_latest(Path(run_dir) / "checkpoints")
    return records[-1]["step"], (store.read_meta(latest)["step"] if latest else None)


def test_time_limit_is_agreed_and_the_stop_is_saved(tmp_path: Path) -> None:
    """Each rank's clock alone would stop them at different steps: the one all-reduce per step
    stops both at the same one, which is saved (checkpointing is on)."""
    (stop0, saved0), (stop1, saved1) = run_distributed(_stop_for_time, 2, str(tmp_path))
    assert stop0 == stop1 == saved0 == saved1 and stop0 < 100_000
