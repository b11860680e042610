"""Every key an entry point accepts is read by the code that runs it.

Each entry point runs in-process through its real Hydra main on a tiny task; the typed config
it composes is swapped for one that records which fields tpformer's own code reads (reads by
the validator, which only checks, and by dataclasses.asdict, which only records, do not count).
A key that no code reads is one a user could set to no effect: the test names it.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest

import tpformer.cli.shell
from tests.data.common import write_corpus
from tests.data.test_glue import write_glue_file
from tests.train.test_finetune import sentiment_rows, write_hf_bert

REPO = Path(__file__).resolve().parents[2]
PACKAGE = str(REPO / "tpformer")
VALIDATOR = str(REPO / "tpformer" / "config" / "validate.py")


def _record_reads(obj: object, prefix: str, reads: set[str]) -> None:
    """Swap obj's class (and its nested configs') for a subclass that records field reads."""
    names = {f.name for f in dataclasses.fields(obj)}  # type: ignore[arg-type]
    for name in names:
        value = getattr(obj, name)
        if dataclasses.is_dataclass(value):
            _record_reads(value, f"{prefix}{name}.", reads)

    def getattribute(self: object, name: str) -> object:
        if name in names:
            caller = sys._getframe(1).f_code.co_filename
            if caller.startswith(PACKAGE) and caller != VALIDATOR:
                reads.add(prefix + name)
        return object.__getattribute__(self, name)

    cls = type(obj)
    obj.__class__ = type(cls.__name__, (cls,), {"__getattribute__": getattribute})


def _all_keys(obj: object, prefix: str = "") -> set[str]:
    keys = set()
    for f in dataclasses.fields(obj):  # type: ignore[arg-type]
        value = getattr(obj, f.name)
        keys |= (
            _all_keys(value, f"{prefix}{f.name}.")
            if dataclasses.is_dataclass(value)
            else {prefix + f.name}
        )
    return keys


def _run(
    monkeypatch: pytest.MonkeyPatch, module: str, overrides: list[str], launch: bool = False
) -> tuple[set[str], set[str]]:
    """(keys read, all keys) of one in-process run of `module`'s Hydra main."""
    reads: set[str] = set()
    keys: set[str] = set()
    to_config = tpformer.cli.shell.to_config

    def recording(cfg: object) -> object:
        config = to_config(cfg)
        keys.update(_all_keys(config))
        _record_reads(config, "", reads)
        return config

    monkeypatch.setattr(tpformer.cli.shell, "to_config", recording)
    if launch:  # the relaunch path reads the launcher keys, then hands over to torchrun
        monkeypatch.setattr(tpformer.cli.shell, "launch_local", lambda *a, **k: 0)
    monkeypatch.setattr(sys, "argv", [module, *overrides])
    entry = __import__(module, fromlist=["main"])
    entry.main()
    return reads, keys


READ_BY_RANKS_ONLY = {
    "launcher.timeout_s",
    "parallel.gloo_shortcuts",
    "parallel.sequence_parallel",
    "parallel.virtual_stages",
    "parallel.pipeline_schedule",
    "parallel.pipedream_update",
    "parallel.pipedream_vertical_sync",
    "parallel.pipeline_layers",
}
"""Read where a process group exists: in-process runs have none, and the relaunch path is cut
before the ranks start.
tests/faults/test_processes.py::test_stopped_rank_fails_the_job_within_the_timeout,
tests/train/test_trainer.py::test_cli_sequence_parallel_run_gives_the_tp1_losses and
tests/pipeline/test_pipeline_training.py (interleaved_1f1b), tests/pipeline/test_pipeline_cli.py
(pipedream_update=step), tests/pipeline/test_pipedream.py (both pipedream keys) and
tests/pipeline/test_pipeline_training.py (pipeline_layers) show them acting."""


OPTION_RUNS = [["optim.name=lars"]]
"""Keys only an option reads (LARS's momentum and trust coefficient): one more run with it."""
ROTARY_RUN = [
    "model.arch=gpt",
    "model.norm.position=pre",
    "+model/rotary=on",
    "model.rotary.scaling=llama3",
]
"""The rotary keys (a decoder with Llama 3.1's scaling reads every one of them)."""
MODERNBERT_RUN = ["model=modernbert_tiny", "data.sentence_pairs=none"]
"""The encoder's family keys (pre-norm, local attention and its rope base, the pooler)."""


def _assert_every_key_read(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    module: str,
    overrides: list[str],
    options: list[list[str]] = OPTION_RUNS,
) -> set[str]:
    """One run on this rank, one through the relaunch path and one per option run; every key
    read by one of them."""
    reads, keys = _run(monkeypatch, module, [*overrides, f"hydra.run.dir={tmp_path / 'run'}"])
    launched, _ = _run(
        monkeypatch,
        module,
        [*overrides, "launcher.nproc_per_node=2", f"hydra.run.dir={tmp_path / 'launched'}"],
        launch=True,
    )
    for i, option in enumerate(options):
        reads |= _run(
            monkeypatch, module, [*overrides, *option, f"hydra.run.dir={tmp_path / f'option{i}'}"]
        )[0]
    assert sorted(keys - reads - launched - READ_BY_RANKS_ONLY) == []
    return keys


@pytest.mark.slow
def test_every_pretraining_key_is_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    corpus = write_corpus(tmp_path / "corpus.txt", documents=20)
    keys = _assert_every_key_read(
        monkeypatch,
        tmp_path,
        "tpformer.cli.pretrain",
        [
            "model=bert_tiny",
            "model.vocab_size=160",
            "data=text",
            f"data.paths=[{corpus}]",
            f"data.cache_dir={tmp_path / 'cache'}",
            "data.seq_length=32",
            "data.workers=1",
            "trainer.micro_batch_size=4",
            "trainer.max_steps=2",
            "trainer.save_every=1",
            "trainer.resume=auto",
            "trainer.progress=false",
            "trainer.eval_steps=1",
            "parallel.recompute=full",
        ],
        options=[*OPTION_RUNS, ROTARY_RUN, MODERNBERT_RUN],
    )
    assert len(keys) > 60


@pytest.mark.slow
def test_every_finetuning_key_is_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    hf = write_hf_bert(tmp_path / "hf")
    write_glue_file(tmp_path / "glue", "SST-2", "train", sentiment_rows(16, 1))
    write_glue_file(tmp_path / "glue", "SST-2", "dev", sentiment_rows(8, 2))
    keys = _assert_every_key_read(
        monkeypatch,
        tmp_path,
        "tpformer.cli.finetune",
        [
            "task=sst2",
            f"init={hf}",
            f"data.glue_dir={tmp_path / 'glue'}",
            f"data.cache_dir={tmp_path / 'cache'}",
            "trainer.epochs=1",
            "trainer.batch_size=8",
            "trainer.save_every=1",
            "trainer.resume=auto",
            "trainer.progress=false",
            "parallel.recompute=full",
        ],
        options=[*OPTION_RUNS, ["dry_run.world=2", "dry_run.ranks=[1]"]],  # a dry run's keys
    )
    assert len(keys) > 40
