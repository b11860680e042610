"""Pipeline parallelism in the training loop: every schedule, alone and with TP, DP, ZeRO-1 and
recomputation, gives the 1-process loss curve (dropout on) to FP32_MODEL_REL."""

from dataclasses import replace
from pathlib import Path

import pytest

from tests.dist import run_distributed
from tests.tolerances import FP32_MODEL_REL
from tests.train.test_trainer import tiny_config
from tpformer.config.presets import preset
from tpformer.config.schema import Config, LocalAttentionConfig
from tpformer.parallel.context import ParallelContext
from tpformer.train.pretraining import pretraining_trainer

GLOBAL_BATCH = 8


def pipeline_config(
    arch: str = "bert", steps: int = 3, micro: int = 8, accum: int = 1, **parallel
) -> Config:
    """tiny_config's run on a 4-layer model (so 4 stages fit), dropout 0.1, global batch 8."""
    config = tiny_config(steps=steps, micro=micro, accum=accum, **parallel)
    if arch == "llama":  # rotary positions, RMSNorm, SwiGLU, 2 key/value groups, untied head
        llama = preset(
            "llama_tiny", vocab_size=128, hidden_size=64, num_heads=4, num_kv_heads=2,
            intermediate_size=128, num_layers=4, max_position_embeddings=64,
        )  # fmt: skip
        return replace(config, model=llama)
    if arch == "modernbert":  # pre-norm GeGLU, rope, layers 1-2 in a window of 8, MLM only
        modern = preset(
            "modernbert_tiny", vocab_size=128, hidden_size=64, num_heads=4, intermediate_size=128,
            num_layers=4, max_position_embeddings=64, dropout=0.1,
            local_attention=LocalAttentionConfig(window=8),
            attention_dropout=0.1,
        )  # fmt: skip
        data = replace(config.data, sentence_pairs="none")
        return replace(config, model=modern, data=data)
    model = (
        replace(config.model, num_layers=4)
        if arch == "bert"
        else preset(
            "gpt2_small",
            vocab_size=128,
            hidden_size=64,
            num_heads=4,
            intermediate_size=256,
            num_layers=4,
            max_position_embeddings=64,
            dropout=0.1,
            attention_dropout=0.1,
        )
    )
    return replace(config, model=model)


def _curves(ctx: ParallelContext, config: Config, run_dir: str) -> list[tuple[float, ...]]:
    records = pretraining_trainer(config, ctx, Path(run_dir)).train()
    keys = ("loss", "mlm_accuracy", "nsp_accuracy", "grad_norm")
    return [tuple(r[k] for k in keys if k in r) for r in records]


def _reference(tmp_path: Path, arch: str = "bert") -> list[tuple[float, ...]]:
    return _curves(
        ParallelContext.single(device="cpu"), pipeline_config(arch), str(tmp_path / "reference")
    )


def _assert_same_curves(curves: list, reference: list) -> None:
    assert len(curves) == len(reference)
    for got, want in zip(curves, reference):
        assert abs(got[0] - want[0]) <= FP32_MODEL_REL * abs(want[0]), (curves, reference)
        assert abs(got[-1] - want[-1]) <= FP32_MODEL_REL * abs(want[-1]), (curves, reference)
        assert got[1:-1] == want[1:-1], (curves, reference)  # accuracies: equal hit counts


CASES = [  # (pp, tp, dp, schedule, extra)
    (2, 1, 1, "gpipe", {}),
    (2, 1, 1, "1f1b", {}),
    (2, 1, 1, "interleaved_1f1b", {}),
    (4, 1, 1, "1f1b", {}),
    (2, 2, 1, "1f1b", {}),
    (2, 1, 2, "1f1b", {"zero_stage": 1}),
    (2, 1, 1, "1f1b", {"recompute": "full"}),
]


@pytest.mark.sweep
@pytest.mark.parametrize(("pp", "tp", "dp", "schedule", "extra"), CASES)
def test_pipeline_loss_curve_equals_one_process(
    tmp_path: Path, pp: int, tp: int, dp: int, schedule: str, extra: dict
) -> None:
    """4 micro-batches per step (grad_accum) at the global batch of the 1-process run."""
    reference = _reference(tmp_path)
    accum = 4
    config = pipeline_config(
        micro=GLOBAL_BATCH // (dp * accum),
        accum=accum,
        tensor=tp,
        pipeline=pp,
        pipeline_schedule=schedule,
        **extra,
    )
    for curves in run_distributed(
        _curves, pp * tp * dp, config, str(tmp_path / "run"), tensor=tp, pipeline=pp
    ):
        _assert_same_curves(curves, reference)


@pytest.mark.parametrize("extra", [{"sequence_parallel": True}, {"pipeline_layers": [1, 3]}])
def test_pipeline_with_tp_sequence_parallel_and_explicit_split(tmp_path: Path, extra: dict) -> None:
    """pipeline=2 x tensor=2 with sequence parallelism (the sequence-sharded activations
    travel between stages), and an uneven explicit split."""
    reference = _reference(tmp_path)
    tp = 2 if extra.get("sequence_parallel") else 1
    config = pipeline_config(micro=2, accum=4, tensor=tp, pipeline=2, **extra)
    for curves in run_distributed(
        _curves,
        2 * tp,
        config,
        str(tmp_path / "run"),
        tensor=tp,
        pipeline=2,
        sequence_parallel=extra.get("sequence_parallel", False),
    ):
        _assert_same_curves(curves, reference)


@pytest.mark.sweep
@pytest.mark.parametrize(
    ("arch", "schedule", "extra"),
    [
        ("gpt", "1f1b", {}),
        ("gpt", "interleaved_1f1b", {}),
        ("llama", "1f1b", {}),
        ("llama", "1f1b", {"data": 2, "zero_stage": 1}),
        ("modernbert", "1f1b", {}),
    ],
)
def test_gpt_pipeline_loss_curve_equals_one_process(
    tmp_path: Path, arch: str, schedule: str, extra: dict
) -> None:
    """GPT: the tied LM head on the last stage, the token embedding on the first; a Llama-style
    decoder's own LM head on the last stage (nothing tied), also under DP=2 with ZeRO-1; a
    ModernBERT-style encoder's final norm and MLM-only head on the last stage."""
    reference = _reference(tmp_path, arch)
    dp = extra.get("data", 1)
    config = pipeline_config(
        arch, micro=2, accum=4 // dp, pipeline=2, pipeline_schedule=schedule, **extra
    )
    for curves in run_distributed(
        _curves, 2 * dp, config, str(tmp_path / "run"), pipeline=2, data=dp
    ):
        _assert_same_curves(curves, reference)


STEPS, EXIT = 5, 2


def _run(ctx: ParallelContext, config: Config, run_dir: str, **trainer) -> dict[int, float]:
    config = replace(config, trainer=replace(config.trainer, max_steps=STEPS, **trainer))
    records = pretraining_trainer(config, ctx, Path(run_dir)).train()
    return {r["step"]: r["loss"] for r in records}


def _launch(fn, layout: dict, *args) -> list:
    """Global batch 8 at every layout: micro 2 x accum 4 under PP, else micro 8."""
    pp, tp = layout.get("pipeline", 1), layout.get("tensor", 1)
    config = pipeline_config(micro=8 if pp == 1 else 2, accum=1 if pp == 1 else 4, **layout)
    if pp * tp == 1:
        return [fn(ParallelContext.single(device="cpu"), config, *args)]
    return run_distributed(fn, pp * tp, config, *args, tensor=tp, pipeline=pp)


def _save_then_resume(ctx: ParallelContext, config: Config, straight: str, run: str) -> tuple:
    whole = _run(ctx, config, straight)
    _run(ctx, config, run, exit_at_step=EXIT)
    return whole, _run(ctx, config, run, resume="auto")


@pytest.mark.slow  # over 5 s (the quick tier leaves single cases that long to the full run)
def test_pipeline_stop_and_resume_is_bitwise_equal(tmp_path: Path) -> None:
    for whole, resumed in _launch(
        _save_then_resume, {"pipeline": 2}, str(tmp_path / "a"), str(tmp_path / "b")
    ):
        assert min(resumed) == EXIT + 1
        for step in range(EXIT + 1, STEPS + 1):
            assert resumed[step] == whole[step], (resumed, whole)


def _save(ctx: ParallelContext, config: Config, run_dir: str) -> None:
    _run(ctx, config, run_dir, exit_at_step=EXIT)


def _resume(ctx: ParallelContext, config: Config, run_dir: str, source: str) -> dict:
    return _run(ctx, config, run_dir, resume=source)


@pytest.mark.sweep
@pytest.mark.parametrize(
    ("saved", "resumed"),
    [
        ({"pipeline": 2}, {}),  # PP 2 -> one process
        ({}, {"pipeline": 2}),  # one process -> PP 2
        ({"pipeline": 2, "tensor": 2}, {"pipeline": 4}),  # PP 2 x TP 2 -> PP 4
    ],
)
def test_pipeline_checkpoints_are_layout_free(tmp_path: Path, saved: dict, resumed: dict) -> None:
    """The stages write their own parameters (the tied word embedding once); any layout
    resumes within 1e-5 of the uninterrupted 1-process run."""
    straight = _run(ParallelContext.single(device="cpu"), pipeline_config(), str(tmp_path / "a"))
    _launch(_save, saved, str(tmp_path / "b"))
    source = str(tmp_path / "b" / "checkpoints" / f"step{EXIT:08d}")
    for losses in _launch(_resume, resumed, str(tmp_path / "c"), source):
        assert min(losses) == EXIT + 1
        for step in range(EXIT + 1, STEPS + 1):
            assert abs(losses[step] - straight[step]) <= FP32_MODEL_REL * straight[step], (
                losses,
                straight,
            )
