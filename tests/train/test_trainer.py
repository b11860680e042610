"""The training loop: layout-independent loss curves, the entry point through the launcher,
the memory model against measured accounting."""

import json
import os
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from tests.cli.forked import run_script
from tests.cli.in_process import outcome, selected_cases
from tests.dist import run_distributed
from tests.docs.commands import arguments, documented
from tests.tolerances import FP32_MODEL_REL
from tpformer.config.presets import preset
from tpformer.config.schema import Config, DataConfig, OptimConfig, ParallelConfig, TrainerConfig
from tpformer.engine.memory import zero_memory_bytes
from tpformer.parallel.context import ParallelContext
from tpformer.train.pretraining import pretraining_trainer

REPO = Path(__file__).resolve().parents[2]
PRETRAIN = "tpformer.cli.pretrain:main"
QUIET = ["trainer.loggers=[]", "trainer.plot=false"]
"""No TensorBoard events and no loss plot (about a second of a tiny run's start and end): the
tests of those files ask for them (tests/train/test_loggers.py and the runs that read them)."""
TINY = [
    "model=bert_tiny",
    "data=synthetic",
    "model.vocab_size=128",
    "model.num_heads=4",
    "data.seq_length=32",
    "trainer.micro_batch_size=4",
    "trainer.progress=false",
    *QUIET,
]


def tiny_config(steps: int = 4, micro: int = 4, accum: int = 1, **parallel) -> Config:
    return Config(
        model=preset("bert_tiny", vocab_size=128, num_heads=4, dropout=0.1, attention_dropout=0.1),
        parallel=ParallelConfig(**parallel),
        optim=OptimConfig(lr=1e-3, warmup_steps=1),
        data=DataConfig(source="synthetic", seq_length=32),
        trainer=TrainerConfig(
            max_steps=steps,
            micro_batch_size=micro,
            grad_accum=accum,
            log_every=1,
            eval_steps=1,
            progress=False,
            loggers=[],
            plot=False,
        ),
    )


def _curves(ctx: ParallelContext, config: Config, run_dir: str) -> list[tuple[float, ...]]:
    records = pretraining_trainer(config, ctx, Path(run_dir)).train()
    return [(r["loss"], r["mlm_accuracy"], r["nsp_accuracy"]) for r in records]


@pytest.mark.sweep
@pytest.mark.parametrize(("tp", "dp", "accum"), [(2, 1, 1), (1, 2, 1), (1, 1, 2), (2, 2, 2)])
def test_loss_curve_is_the_same_in_every_layout(
    tmp_path: Path, tp: int, dp: int, accum: int
) -> None:
    """Global batch 8 each time: 8 x 1 x 1, or 4 x 1 x 2 (dp), or 4 x 2 x 1 (accumulation).
    The accuracies are counts of argmax hits over global counts: equal, not just close (a hit
    is decided against the exact global row maximum, which all layouts share)."""
    reference = _curves(ParallelContext.single(device="cpu"), tiny_config(micro=8), str(tmp_path))
    config = tiny_config(micro=8 // (dp * accum), accum=accum, tensor=tp)
    for curves in run_distributed(_curves, tp * dp, config, str(tmp_path / "run"), tensor=tp):
        assert len(curves) == len(reference)
        for (loss, mlm_acc, nsp_acc), (want, want_mlm, want_nsp) in zip(curves, reference):
            assert abs(loss - want) <= FP32_MODEL_REL * abs(want), (curves, reference)
            assert (mlm_acc, nsp_acc) == (want_mlm, want_nsp), (curves, reference)


@pytest.mark.sweep
@pytest.mark.parametrize(
    ("tp", "dp", "extra"),
    [
        (2, 1, {}),
        (4, 1, {}),
        (2, 2, {}),
        (2, 2, {"zero_stage": 1}),
        (2, 2, {"zero_stage": 3}),
        (2, 1, {"recompute": "selective"}),
        (2, 1, {"recompute": "full"}),
    ],
)
def test_sequence_parallel_loss_curve_equals_tp1(
    tmp_path: Path, tp: int, dp: int, extra: dict
) -> None:
    """Dropout 0.1 on: the sequence-sharded regions draw their chunk of the TP=1 masks, and the
    LayerNorm/bias/position gradients summed over TP give the TP=1 update (global batch 8)."""
    reference = _curves(ParallelContext.single(device="cpu"), tiny_config(micro=8), str(tmp_path))
    config = tiny_config(micro=8 // dp, tensor=tp, sequence_parallel=True, **extra)
    for curves in run_distributed(
        _curves, tp * dp, config, str(tmp_path / "run"), tensor=tp, sequence_parallel=True
    ):
        assert len(curves) == len(reference)
        for (loss, mlm_acc, nsp_acc), (want, want_mlm, want_nsp) in zip(curves, reference):
            assert abs(loss - want) <= FP32_MODEL_REL * abs(want), (curves, reference)
            assert (mlm_acc, nsp_acc) == (want_mlm, want_nsp), (curves, reference)


@pytest.mark.slow  # over ~5 s: the slow tier
def test_mlm_loss_falls_on_learnable_data(tmp_path: Path) -> None:
    config = replace(tiny_config(steps=300, micro=8), optim=OptimConfig(lr=1e-3, warmup_steps=10))
    config.trainer.log_every = 20
    config.trainer.loggers, config.trainer.plot = TrainerConfig().loggers, True
    records = pretraining_trainer(config, ParallelContext.single(device="cpu"), tmp_path).train()
    mlm = [r["mlm_loss"] for r in records]
    assert mlm[-1] < 0.7 * mlm[0], mlm  # from ln(128) = 4.85 toward ln(128 / 16 topics) = 2.08
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert {"step", "loss", "lr", "tokens_per_s"} <= set(lines[0])
    assert lines[-1]["eval"] is True
    assert (tmp_path / "loss_curve.png").stat().st_size > 1000
    assert any((tmp_path / "tensorboard").iterdir())


def _memory(ctx: ParallelContext, stage: int, run_dir: str) -> tuple:
    config = tiny_config(steps=1, zero_stage=stage)
    trainer = pretraining_trainer(config, ctx, Path(run_dir))
    trainer.train()
    params_per_rank = sum(s.numel for b in trainer.engine.buckets for s in b.segments)
    estimate = zero_memory_bytes(stage, params_per_rank, ctx.layout.dp)
    return trainer.engine.memory_report(), estimate


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_memory_model_matches_measured_accounting(stage: int, tmp_path: Path) -> None:
    for measured, estimate in run_distributed(_memory, 2, stage, str(tmp_path), tensor=1):
        for field in ("params", "grads", "optimizer"):
            got, want = getattr(measured, field), getattr(estimate, field)
            assert abs(got - want) <= 0.10 * want, f"stage {stage} {field}: {got} vs {want}"


def _cli(args: list[str], cwd: Path, timeout: int = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    return run_script("tpformer.cli.pretrain", args, cwd=cwd, env=env, timeout=timeout)


@pytest.mark.slow
def test_launcher_runs_two_ranks_in_one_run_directory(tmp_path: Path) -> None:
    """README's laptop layout (its bert_mini shrunk to TINY's bert_tiny) through the launcher."""
    _, laptop = arguments(
        documented("tpformer-pretrain model=bert_mini parallel.tensor=2 launcher.nproc_per_node=2"),
        {"model=bert_mini": "model=bert_tiny"},
    )
    result = _cli(
        [
            *laptop,
            *[x for x in TINY if x not in QUIET],  # the plot and TensorBoard: in one directory
            "trainer.max_steps=3",
            "trainer.log_every=1",
        ],
        tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    runs = [p for p in (tmp_path / "outputs").glob("*/*") if p.is_dir()]
    assert len(runs) == 1, runs  # both ranks wrote into one directory
    run = runs[0]
    assert "layout: world 2 = dp 1 x tp 2" in result.stderr
    assert "attention: 2 layers explicit (rng=exact" in result.stderr  # the CPU's default rng
    assert (run / ".hydra" / "config.yaml").read_text().count("tensor: 2") == 1
    assert len((run / "metrics.jsonl").read_text().splitlines()) == 4  # steps 1, 2, 3 + eval
    assert (run / "train.log").exists() and (run / "loss_curve.png").exists()
    assert any((run / "tensorboard").iterdir())


@pytest.mark.slow
def test_cli_sequence_parallel_run_gives_the_tp1_losses(tmp_path: Path) -> None:
    """docs/parallel/sequence.md's command (its bert_base shrunk to bert_tiny): tensor=2 with
    sequence parallelism, dropout 0.1, against TP=1."""
    _, sequence_parallel = arguments(
        documented("tpformer-pretrain model=bert_base parallel.tensor=2 parallel.sequence"),
        {"model=bert_base": "model=bert_tiny"},
    )
    losses = {}
    for name, layout in (("tp1", []), ("sp", sequence_parallel)):
        run = tmp_path / name
        result = _cli(
            [
                *TINY,
                "trainer.max_steps=3",
                "trainer.log_every=1",
                "model.dropout=0.1",
                "model.attention_dropout=0.1",
                *layout,
                f"hydra.run.dir={run}",
            ],
            tmp_path,
        )
        assert result.returncode == 0, result.stderr[-3000:]
        lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
        losses[name] = [x["loss"] for x in lines if not x.get("eval")]
    assert "sequence_parallel true" in result.stderr
    assert len(losses["sp"]) == len(losses["tp1"]) == 3
    for got, want in zip(losses["sp"], losses["tp1"]):
        assert abs(got - want) <= FP32_MODEL_REL * want, losses


@pytest.mark.slow
def test_multirun_sweeps_layouts(tmp_path: Path) -> None:
    """README's sweep: with the global batch fixed, TP=1 (DP=2) and TP=2 (accumulation 2) give
    the same losses (exact mode, FP32_MODEL_REL)."""
    _, argv = arguments(documented("tpformer-pretrain -m parallel.tensor=1,2"))  # README's
    result = _cli([*argv, *TINY, "trainer.max_steps=2", "trainer.log_every=1"], tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    jobs = sorted((tmp_path / "multirun").glob("*/*/*/metrics.jsonl"))
    assert len(jobs) == 2
    configs = [(j.parent / ".hydra" / "config.yaml").read_text() for j in jobs]
    assert "tensor: 1" in configs[0] and "tensor: 2" in configs[1]
    curves = [
        [r["loss"] for r in map(json.loads, j.read_text().splitlines()) if "eval" not in r]
        for j in jobs
    ]
    assert len(curves[0]) == 2 and len(curves[1]) == 2, curves
    for got, want in zip(curves[1], curves[0], strict=True):
        assert abs(got - want) <= FP32_MODEL_REL * abs(want), curves


BAD_VALUES = [
    ("parallel.tensor=3", "error: parallel.tensor=3 does not divide world_size=2"),
    ("trainer.grad_accum=0", "error: trainer.grad_accum=0 must be >= 1"),
    (
        "parallel.tensor=1 trainer.global_batch_size=10",  # dp 2, micro 4 (TINY)
        "error: trainer.global_batch_size=10 is not a multiple of trainer.micro_batch_size=4 "
        "x dp=2 = 8; valid at this layout: trainer.micro_batch_size in [1, 5]",
    ),
    (
        "parallel.grad_compression=powersgd parallel.zero_stage=2",
        "error: parallel.grad_compression=powersgd needs parallel.zero_stage 0 or 1 (got 2)",
    ),
    (
        "parallel.sequence_parallel=true",
        "error: parallel.sequence_parallel=true needs parallel.tensor > 1 (got parallel.tensor=1)",
    ),
    (
        "parallel.tensor=2 parallel.sequence_parallel=true data.seq_length=31",
        "error: data.seq_length=31 must be divisible by parallel.tensor=2 with "
        "parallel.sequence_parallel=true (e.g. 30 or 32)",
    ),
    (
        "parallel.context=2 data.seq_length=30",
        "error: data.seq_length=30 must be divisible by 4 with parallel.context=2 (two "
        "mirrored chunks per CP rank); e.g. 28 or 32",
    ),
]


@pytest.mark.sweep
@pytest.mark.parametrize(("override", "message"), BAD_VALUES)
def test_bad_values_exit_2_with_one_line(
    override: str, message: str, request: pytest.FixtureRequest
) -> None:
    def argv(override: str) -> list[str]:
        return [*TINY, *override.split(), "launcher.nproc_per_node=2"]

    table = [argv(case["override"]) for case in selected_cases(request)]
    result = outcome(PRETRAIN, argv(override), table, request)
    assert result.code == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(message) and not result.left, result


def test_typo_fails_before_any_process(tmp_path: Path) -> None:
    result = _cli(["parallel.tensr=2"], tmp_path)
    assert result.returncode == 2
    assert "error: parallel.tensr is not a config key; did you mean parallel.tensor?" in (
        result.stderr
    )
