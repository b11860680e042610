"""DCP checkpoints: exact resume, atomic completion, bad checkpoints named."""

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from tests.dist import run_distributed, start_ranks
from tests.faults.job import children
from tests.train.test_trainer import tiny_config
from tpformer.checkpoint import store
from tpformer.config.presets import preset
from tpformer.config.schema import Config
from tpformer.config.validate import validate
from tpformer.parallel.context import ParallelContext
from tpformer.train.pretraining import pretraining_trainer

STEPS, EXIT = 6, 3


def _trainer(config: Config, run_dir: str, **trainer) -> Config:
    return replace(config, trainer=replace(config.trainer, **trainer))


def _run(ctx: ParallelContext, config: Config, run_dir: str, **trainer) -> dict[int, float]:
    records = pretraining_trainer(_trainer(config, run_dir, **trainer), ctx, Path(run_dir)).train()
    return {r["step"]: r["loss"] for r in records}


def _interrupted(ctx: ParallelContext, config: Config, straight_dir: str, run_dir: str) -> tuple:
    straight = _run(ctx, config, straight_dir)
    first = _run(ctx, config, run_dir, exit_at_step=EXIT)
    resumed = _run(ctx, config, run_dir, resume="auto")
    return straight, first, resumed


@pytest.mark.sweep
@pytest.mark.parametrize(
    ("world", "parallel"),
    [
        (1, {}),
        (2, {"tensor": 2}),
        (2, {"zero_stage": 3}),
        (2, {"zero_stage": 1}),
        (2, {"tensor": 2, "sequence_parallel": True, "precision": "fp8"}),  # scales of the step
    ],
)
def test_stop_and_resume_is_bitwise_equal(tmp_path: Path, world: int, parallel: dict) -> None:
    config = tiny_config(steps=STEPS, **parallel)
    if world == 1:
        results = [
            _interrupted(
                ParallelContext.single(device="cpu"),
                config,
                str(tmp_path / "a"),
                str(tmp_path / "b"),
            )
        ]
    else:
        results = run_distributed(
            _interrupted,
            world,
            config,
            str(tmp_path / "a"),
            str(tmp_path / "b"),
            tensor=parallel.get("tensor", 1),
            sequence_parallel=parallel.get("sequence_parallel", False),
        )
    for straight, first, resumed in results:
        assert max(first) == EXIT and min(resumed) == EXIT + 1
        for step in range(EXIT + 1, STEPS + 1):
            assert resumed[step] == straight[step], (step, resumed, straight)
        for step in range(1, EXIT + 1):
            assert first[step] == straight[step]
    latest = store.find_latest(tmp_path / "b" / "checkpoints")
    assert latest is not None and latest.name == store.step_dir_name(EXIT)
    assert json.loads((latest / "meta.json").read_text())["world_size"] == world
    if parallel.get("tensor", 1) == 2:
        _assert_each_tp_rank_wrote_its_slice(latest)


def _assert_each_tp_rank_wrote_its_slice(checkpoint: Path) -> None:
    """A TP-sharded parameter is stored as two row-chunks of the logical tensor, one in each
    rank's file; a replicated one (LayerNorm) as one whole tensor."""
    from torch.distributed.checkpoint import FileSystemReader

    metadata = FileSystemReader(str(checkpoint)).read_metadata()
    key = "engine.param/bert.encoder.layers.0.attention.qkv.weight"
    chunks = metadata.state_dict_metadata[key].chunks
    assert sorted((tuple(c.offsets), tuple(c.sizes)) for c in chunks) == [
        ((0, 0), (192, 128)),
        ((192, 0), (192, 128)),
    ]
    files = {
        info.relative_path for index, info in metadata.storage_data.items() if index.fqn == key
    }
    assert files == {"__0_0.distcp", "__1_0.distcp"}
    norm = [
        k for k in metadata.state_dict_metadata if k.startswith("engine.param/") and "norm" in k
    ]
    assert norm and all(len(metadata.state_dict_metadata[k].chunks) == 1 for k in norm)


def test_incomplete_checkpoints_are_never_latest(tmp_path: Path) -> None:
    ctx = ParallelContext.single(device="cpu")
    config = tiny_config(steps=4)
    _run(ctx, config, str(tmp_path), save_every=2, keep_last=1)
    root = tmp_path / "checkpoints"
    assert [p.name for p in root.glob("step*")] == ["step00000004"]  # keep_last=1
    # a save killed before completion: the directory exists, meta.json does not
    shutil.copytree(root / "step00000004", root / "step00000006")
    (root / "step00000006" / "meta.json").unlink()
    (root / "latest").write_text("step00000006")
    assert store.find_latest(root) == root / "step00000004"
    assert (tmp_path / "checkpoints" / ".tmp-step00000004").exists() is False


def _train_and_hang_in_second_save(ctx: ParallelContext, config: Config, run_dir: str) -> None:
    """Save at step 2 normally; at step 4 every rank finishes its DCP write, leaves a marker and
    hangs before the checkpoint is completed (meta.json, rename), waiting to be killed."""
    import time

    import torch.distributed.checkpoint as dcp  # what checkpoint/store.py calls at each save

    real_save, calls = dcp.save, []

    def save_then_hang(*args, **kwargs):
        real_save(*args, **kwargs)
        calls.append(1)
        if len(calls) == 2:
            (Path(run_dir) / f"written{ctx.rank}").touch()
            time.sleep(3600)

    dcp.save = save_then_hang
    _run(ctx, config, run_dir, save_every=2)


@pytest.mark.slow
def test_ranks_killed_mid_save_leave_the_previous_checkpoint_latest(tmp_path: Path) -> None:
    """SIGKILL both ranks after their shards of step 4 are on disk but before the checkpoint is
    complete: step 2 stays latest, resume=auto continues from it, the leftover is replaced."""
    import time

    run_dir = tmp_path / "run"
    procs, _ = start_ranks(
        _train_and_hang_in_second_save, 2, tiny_config(steps=6), str(run_dir), timeout_s=120
    )
    try:
        deadline = time.monotonic() + 120
        while not all((run_dir / f"written{r}").exists() for r in range(2)):
            assert time.monotonic() < deadline and all(p.is_alive() for p in procs)
            time.sleep(0.05)
    finally:
        for p in procs:
            p.kill()
            p.join()
    root = run_dir / "checkpoints"
    partial = root / ".tmp-step00000004"
    assert any(partial.glob("*.distcp")) and not (partial / "meta.json").exists()
    assert (root / "latest").read_text() == "step00000002"
    assert store.find_latest(root) == root / "step00000002"
    resumed = _run(
        ParallelContext.single(device="cpu"),
        tiny_config(steps=6),
        str(run_dir),
        save_every=2,
        resume="auto",
    )
    assert min(resumed) == 3 and max(resumed) == 6
    assert store.find_latest(root) == root / "step00000006" and not partial.exists()


def test_bad_checkpoints_are_named(tmp_path: Path) -> None:
    ctx = ParallelContext.single(device="cpu")
    with pytest.raises(store.CheckpointError, match="is not a complete tpformer checkpoint"):
        _run(ctx, tiny_config(), str(tmp_path), resume=str(tmp_path))
    _run(ctx, tiny_config(steps=2), str(tmp_path), save_every=2)
    saved = tmp_path / "checkpoints" / "step00000002"
    wider = replace(tiny_config(), model=replace(tiny_config().model, hidden_size=64))
    with pytest.raises(ValueError, match="hidden_size: checkpoint 128 vs run 64"):
        _run(ParallelContext.single(device="cpu"), wider, str(tmp_path / "x"), resume=str(saved))
    meta = json.loads((saved / "meta.json").read_text())
    (saved / "meta.json").write_text(json.dumps({**meta, "format_version": 99}))
    with pytest.raises(ValueError, match="checkpoint format 99, newer than"):
        _run(ctx, tiny_config(), str(tmp_path / "y"), resume=str(saved))


@pytest.mark.slow
def test_sigterm_saves_and_exits_cleanly_then_resume_finishes(tmp_path: Path) -> None:
    import os
    import signal
    import subprocess
    import sys
    import time

    from tests.train.test_trainer import REPO, TINY

    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    args = [
        sys.executable,
        "-m",
        "tpformer.cli.pretrain",
        *TINY,
        "trainer.max_steps=100000",
        "launcher.nproc_per_node=2",
        f"hydra.run.dir={tmp_path}",
    ]
    log = (tmp_path / "job.log").open("w")  # a file, not a pipe nobody drains while we wait
    proc = subprocess.Popen(
        args, cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    deadline = time.monotonic() + 120
    while not (tmp_path / "metrics.jsonl").exists() and time.monotonic() < deadline:
        time.sleep(0.5)
    os.killpg(proc.pid, signal.SIGTERM)  # the whole job, as a scheduler's preemption does
    proc.wait(timeout=120)
    output = (tmp_path / "job.log").read_text()
    assert proc.returncode == 0, output[-3000:]
    assert "SIGTERM: saved step" in output
    latest = store.find_latest(tmp_path / "checkpoints")
    assert latest is not None
    saved_step = json.loads((latest / "meta.json").read_text())["step"]
    done = subprocess.run(
        [
            *args[:-3],
            f"trainer.max_steps={saved_step + 2}",
            "trainer.resume=auto",
            "launcher.nproc_per_node=2",
            f"hydra.run.dir={tmp_path}",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"at step {saved_step}" in done.stderr


def _save_at(ctx: ParallelContext, config: Config, run_dir: str) -> None:
    _run(ctx, config, run_dir, exit_at_step=EXIT)


def _resume_from(ctx: ParallelContext, config: Config, run_dir: str, source: str) -> dict:
    return _run(ctx, config, run_dir, resume=source)


RESHARD_REL = 1e-5
"""fp32: after the reshard the same optimizer state continues with other reduction orders."""


@pytest.mark.sweep
@pytest.mark.parametrize(
    ("saved", "resumed"),
    [
        ({"tensor": 2}, {"tensor": 1}),  # TP 2 -> 1
        ({"tensor": 2}, {"tensor": 4}),  # TP 2 -> 4
        ({"zero_stage": 3, "world": 2}, {"zero_stage": 0}),  # ZeRO-3 over DP 2 -> one process
        ({"tensor": 1}, {"zero_stage": 2, "world": 2, "cpu_offload": "optimizer"}),
        ({"tensor": 2, "sequence_parallel": True}, {"tensor": 1}),  # SP -> no SP
        ({"tensor": 2}, {"tensor": 2, "sequence_parallel": True}),  # TP -> TP + SP
        ({"tensor": 2, "optim": "novograd"}, {"zero_stage": 1, "world": 2, "optim": "novograd"}),
        ({"zero_stage": 2, "world": 2, "optim": "lars"}, {"tensor": 2, "optim": "lars"}),
        ({"context": 2, "world": 2}, {"tensor": 1}),  # CP 2 -> one process
        ({"tensor": 1}, {"context": 2, "tensor": 2, "world": 4, "zero_stage": 1}),  # -> CP x TP
        # Llama's 2 key/value heads split over TP=2, then replicated over TP=4 (and back)
        ({"tensor": 2, "model": "llama"}, {"tensor": 4, "model": "llama"}),
        ({"tensor": 4, "model": "llama"}, {"tensor": 1, "model": "llama"}),
    ],
)
def test_resharded_resume_matches_the_uninterrupted_run(
    tmp_path: Path, saved: dict, resumed: dict
) -> None:
    """Also for the layer-wise optimizers' own state (LARS's momentum buffer, NovoGrad's
    per-layer second moment kept expanded over its parameter)."""
    optim = saved.get("optim", "adamw")

    def with_optimizer(config: Config) -> Config:
        lr = {"adamw": config.optim.lr, "novograd": 1e-2, "lars": 5.0}[optim]
        if saved.get("model") == "llama":
            llama = preset(
                "llama_tiny", vocab_size=128, hidden_size=64, num_heads=4, num_kv_heads=2,
                intermediate_size=128, num_layers=2, max_position_embeddings=64,
            )  # fmt: skip
            config = replace(config, model=llama)
        return replace(config, optim=replace(config.optim, name=optim, lr=lr))

    straight = _run(
        ParallelContext.single(device="cpu"),
        with_optimizer(tiny_config(steps=STEPS, micro=8)),
        str(tmp_path / "a"),
    )

    def launch(fn, layout: dict, *args):  # global batch 8 in every layout
        layout = dict(layout)
        layout.pop("optim", None)
        layout.pop("model", None)
        world = layout.pop("world", layout.get("tensor", 1))
        dp = world // (layout.get("tensor", 1) * layout.get("context", 1))
        config = with_optimizer(tiny_config(steps=STEPS, micro=8 // dp, **layout))
        if world == 1:
            return [fn(ParallelContext.single(device="cpu"), config, *args)]
        return run_distributed(
            fn,
            world,
            config,
            *args,
            tensor=layout.get("tensor", 1),
            sequence_parallel=layout.get("sequence_parallel", False),
            context=layout.get("context", 1),
        )

    launch(_save_at, saved, str(tmp_path / "b"))
    source = str(tmp_path / "b" / "checkpoints" / store.step_dir_name(EXIT))
    for losses in launch(_resume_from, resumed, str(tmp_path / "c"), source):
        assert min(losses) == EXIT + 1
        for step in range(EXIT + 1, STEPS + 1):
            assert abs(losses[step] - straight[step]) <= RESHARD_REL * straight[step], (
                losses,
                straight,
            )


def _fixed_global_batch(
    ctx: ParallelContext, config: Config, run_dir: str, trainer: dict
) -> tuple[int, dict[int, float]]:
    """As the entry point does: validate at this layout (trainer.global_batch_size fixes
    grad_accum for it), then train; returns the derived grad_accum and the losses."""
    config = _trainer(config, run_dir, **trainer)
    validate(config, ctx.layout)
    return config.trainer.grad_accum, _run(ctx, config, run_dir)


@pytest.mark.slow
def test_a_fixed_global_batch_continues_the_curve_on_a_smaller_world(tmp_path: Path) -> None:
    """trainer.global_batch_size=8, micro-batch 2, dropout 0.1: 4 ranks (TP=2 x DP=2, ZeRO-1,
    2 micro-batches) stop at step 3; resumed on 2 ranks (TP=2, 4 micro-batches) and on one
    (4 micro-batches), steps 4-6 follow the uninterrupted 4-rank run."""
    config = tiny_config(steps=STEPS, micro=2, zero_stage=1)
    config = replace(config, trainer=replace(config.trainer, global_batch_size=8))
    straight = run_distributed(_fixed_global_batch, 4, config, str(tmp_path / "a"), {}, tensor=2)
    assert straight[0][0] == 2
    stop = {"exit_at_step": EXIT}
    run_distributed(_fixed_global_batch, 4, config, str(tmp_path / "b"), stop, tensor=2)
    source = {"resume": str(tmp_path / "b" / "checkpoints" / store.step_dir_name(EXIT))}
    on_two = run_distributed(_fixed_global_batch, 2, config, str(tmp_path / "c"), source, tensor=2)
    on_one = _fixed_global_batch(
        ParallelContext.single(device="cpu"), config, str(tmp_path / "d"), source
    )
    want = straight[0][1]
    for accum, losses in [*on_two, on_one]:
        assert accum == 4 and min(losses) == EXIT + 1
        for step in range(EXIT + 1, STEPS + 1):
            assert abs(losses[step] - want[step]) <= RESHARD_REL * want[step], (losses, want)
        worst = max(abs(losses[s] - want[s]) / want[s] for s in range(EXIT + 1, STEPS + 1))
        print(f"resumed on a smaller world: worst relative difference {worst:.1e}")


@pytest.mark.slow
def test_killed_rank_restarts_from_the_latest_checkpoint(tmp_path: Path) -> None:
    """launcher.max_restarts=1 (= torchrun --max-restarts 1): SIGKILL one rank after a checkpoint;
    the launcher restarts both ranks, which resume from it and finish the run."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from tests.train.test_trainer import REPO, TINY

    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    steps, every = 160, 20
    args = [
        sys.executable,
        "-m",
        "tpformer.cli.pretrain",
        *TINY,
        f"trainer.max_steps={steps}",
        f"trainer.save_every={every}",
        "trainer.resume=auto",
        "trainer.log_every=10",
        "launcher.nproc_per_node=2",
        "launcher.max_restarts=1",
        f"hydra.run.dir={tmp_path}",
    ]
    log = (tmp_path / "job.log").open("w")
    proc = subprocess.Popen(
        args, cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    try:
        root = tmp_path / "checkpoints"
        deadline = time.monotonic() + 120
        while (
            store.find_latest(root) is None and time.monotonic() < deadline and proc.poll() is None
        ):
            time.sleep(0.05)
        ranks = children(proc.pid)
        assert len(ranks) == 2 and proc.poll() is None, (tmp_path / "job.log").read_text()[-3000:]
        killed_after = store.read_meta(store.find_latest(root))["step"]
        os.kill(ranks[1], signal.SIGKILL)
        proc.wait(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    output = (tmp_path / "job.log").read_text()
    assert proc.returncode == 0, output[-3000:]
    resumed = [
        int(line.rsplit("at step ", 1)[1].split(",")[0].split()[0])
        for line in output.splitlines()
        if "resumed from" in line
    ]
    assert resumed and killed_after <= resumed[0] < steps, output[-3000:]
    records = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert max(r["step"] for r in records) == steps
    assert store.read_meta(store.find_latest(root))["step"] == steps
