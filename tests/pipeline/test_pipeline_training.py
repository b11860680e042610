"""Pipeline parallelism in the training loop: every schedule, alone and with TP, DP, ZeRO-1 and
recomputation, gives the 1-process loss curve (dropout on) to FP32_MODEL_REL."""

from dataclasses import replace
from pathlib import Path

import pytest

from tests.dist import run_distributed
from tests.tolerances import FP32_MODEL_REL
from tpformer.config.presets import preset
from tpformer.config.schema import (Config, DataConfig, OptimConfig, ParallelConfig,
                                    TrainerConfig)
from tpformer.parallel.context import ParallelContext
from tpformer.train.pretraining import pretraining_trainer

GLOBAL_BATCH = 8


def pipeline_config(arch: str = "bert", steps: int = 3, micro: int = 8, accum: int = 1,
                    **parallel) -> Config:
    """A 4-layer model (so 4 stages fit), dropout 0.1, global batch 8."""
    model = (preset("bert_tiny", vocab_size=128, num_heads=4, num_layers=4, dropout=0.1,
                    attention_dropout=0.1) if arch == "bert" else
             preset("gpt2_small", vocab_size=128, hidden_size=64, num_heads=4,
                    intermediate_size=256, num_layers=4, max_position_embeddings=64,
                    dropout=0.1, attention_dropout=0.1))
    return Config(model=model, parallel=ParallelConfig(**parallel),
                  optim=OptimConfig(lr=1e-3, warmup_steps=1),
                  data=DataConfig(source="synthetic", seq_length=32),
                  trainer=TrainerConfig(max_steps=steps, micro_batch_size=micro, grad_accum=accum,
                                        log_every=1, eval_steps=1, progress=False))


def _curves(ctx: ParallelContext, config: Config, run_dir: str) -> list[tuple[float, ...]]:
    records = pretraining_trainer(config, ctx, Path(run_dir)).train()
    keys = ("loss", "mlm_accuracy", "nsp_accuracy", "grad_norm")
    return [tuple(r[k] for k in keys if k in r) for r in records]


def _reference(tmp_path: Path, arch: str = "bert") -> list[tuple[float, ...]]:
    return _curves(ParallelContext.single(device="cpu"), pipeline_config(arch),
                   str(tmp_path / "reference"))


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
    (2, 1, 1, "1f1b", {"activation_checkpointing": "full"}),
]


@pytest.mark.parametrize(("pp", "tp", "dp", "schedule", "extra"), CASES)
def test_pipeline_loss_curve_equals_one_process(tmp_path: Path, pp: int, tp: int, dp: int,
                                                schedule: str, extra: dict) -> None:
    """4 micro-batches per step (grad_accum) at the global batch of the 1-process run."""
    reference = _reference(tmp_path)
    accum = 4
    config = pipeline_config(micro=GLOBAL_BATCH // (dp * accum), accum=accum, tensor=tp,
                             pipeline=pp, pipeline_schedule=schedule, **extra)
    for curves in run_distributed(_curves, pp * tp * dp, config, str(tmp_path / "run"),
                                  tensor=tp, pipeline=pp):
        _assert_same_curves(curves, reference)
