"""Context parallelism in training: every CP layout's loss curve equals one process's, dropout on.

Global batch 8 of 32-token sequences each time; the CP ranks hold two mirrored chunks of every
sequence, attention runs as ring attention, and the gradients are summed over DP x CP.
"""

import re
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from tests.dist import run_distributed
from tests.models.common import tiny_gpt
from tests.tolerances import FP32_MODEL_REL
from tests.train.test_trainer import tiny_config
from tpformer.cli.generate import validate_layout_for_inference
from tpformer.config.schema import Config, ParallelConfig
from tpformer.config.validate import validate
from tpformer.engine.memory import measure_saved_activations
from tpformer.models import build_model
from tpformer.parallel.comm import count_collectives
from tpformer.parallel.context import ParallelContext
from tpformer.parallel.layout import Layout, resolve_layout
from tpformer.planner.layer_memory import layer_activation_bytes
from tpformer.planner.step_time import ring_bytes_per_layer
from tpformer.train.finetuning import batch_width_multiple
from tpformer.train.pretraining import pretraining_trainer


def _curves(ctx: ParallelContext, config: Config, run_dir: str) -> list[tuple[float, ...]]:
    records = pretraining_trainer(config, ctx, Path(run_dir)).train()
    keys = [k for k in ("loss", "mlm_accuracy", "nsp_accuracy") if k in records[0]]
    return [tuple(r[k] for k in keys) for r in records]


def _gpt(config: Config) -> Config:
    return replace(config, model=tiny_gpt(dropout=0.1))


@pytest.mark.sweep
@pytest.mark.parametrize(
    ("arch", "cp", "tp", "dp", "extra"),
    [
        ("bert", 2, 1, 1, {}),
        ("gpt", 2, 1, 1, {}),
        ("bert", 4, 1, 1, {}),
        ("bert", 2, 2, 1, {}),
        ("gpt", 2, 2, 1, {"sequence_parallel": True}),
        ("bert", 2, 1, 2, {"zero_stage": 1}),
        ("gpt", 2, 1, 2, {"zero_stage": 3}),
        ("bert", 2, 1, 1, {"pipeline": 2}),
        ("gpt", 2, 1, 1, {"pipeline": 2}),
    ],
)
def test_context_parallel_loss_curve_equals_one_process(
    tmp_path: Path, arch: str, cp: int, tp: int, dp: int, extra: dict
) -> None:
    """Losses within 1e-5 of one process; accuracies (counts of argmax hits over global counts,
    summed over the CP ranks' positions) equal."""
    as_arch = _gpt if arch == "gpt" else (lambda c: c)
    reference = _curves(
        ParallelContext.single(device="cpu"), as_arch(tiny_config(micro=8)), str(tmp_path)
    )
    pp = extra.get("pipeline", 1)
    accum = 2 if pp > 1 else 1  # two micro-batches fill the pipeline
    config = as_arch(
        tiny_config(micro=8 // (dp * accum), accum=accum, tensor=tp, context=cp, **extra)
    )
    sp = bool(extra.get("sequence_parallel"))
    for curves in run_distributed(
        _curves,
        cp * tp * dp * pp,
        config,
        str(tmp_path / "run"),
        tensor=tp,
        context=cp,
        sequence_parallel=sp,
        pipeline=pp,
    ):
        assert len(curves) == len(reference)
        for got, want in zip(curves, reference, strict=True):
            assert abs(got[0] - want[0]) <= FP32_MODEL_REL * abs(want[0]), (curves, reference)
            assert got[1:] == want[1:], (curves, reference)


def _saved_per_layer(ctx: ParallelContext, seq: int) -> tuple[list[int], float]:
    config = replace(_gpt(tiny_config()).model, max_position_embeddings=seq)
    model = build_model(config, ctx, task="causal_lm").train()
    ids = torch.randint(5, config.vocab_size, (2, seq), generator=torch.Generator().manual_seed(0))

    def forward() -> torch.Tensor:
        ctx.rng.set_position(step=1, sample_offset=0)
        return model(ids, labels=ids).loss

    with count_collectives() as counts:
        saved = measure_saved_activations(model, forward)
    return saved.per_layer, counts.bytes["send"]


@pytest.mark.parametrize("cp", [2, 4])
def test_saved_activations_and_ring_bytes_match_the_formulas(cp: int) -> None:
    """Per layer and rank: what the layer keeps for backward is the planner's formula
    (context=cp: s/cp positions, no probabilities, the exact-mode bool masks of its queries
    against every key), and the bytes sent equal the ring's (2 (cp - 1) + cp) blocks."""
    seq, b = 64, 2
    m = _gpt(tiny_config()).model
    results = run_distributed(_saved_per_layer, cp, seq, context=cp)
    formula = layer_activation_bytes(
        seq,
        b,
        m.hidden_size,
        m.num_heads,
        m.intermediate_size,
        tp=1,
        sequence_parallel=False,
        recompute="none",
        itemsize=4,
        mask_bytes=4,
        context=cp,
        attention_dropout=True,
    )
    ring = ring_bytes_per_layer(b, m.num_heads, seq, m.hidden_size, tp=1, cp=cp, itemsize=4)
    for per_layer, sent in results:
        # the formula leaves out the LayerNorms' row statistics (O(s b), under 1% here)
        assert all(0 <= kept - formula <= 0.01 * formula for kept in per_layer), (
            per_layer,
            formula,
        )
        assert sent == m.num_layers * ring
        assert ring == (2 * (cp - 1) + cp) * 2 * b * (seq // cp) * m.hidden_size * 4


@pytest.mark.parametrize(
    ("world", "parallel", "seq", "message"),
    [
        (4, {"context": 3}, 32, "parallel.tensor=1 x parallel.context=3 = 3 does not divide "
         "world_size=4; valid products are [1, 2, 4]"),
        (8, {"context": 2, "tensor": 4, "sequence_parallel": True}, 36,
         "data.seq_length=36 must be divisible by 8 with parallel.context=2 (two mirrored "
         "chunks per CP rank, each split over the TP group); e.g. 32 or 40"),
        (2, {"context": 2}, 30, "data.seq_length=30 must be divisible by 4 with "
         "parallel.context=2 (two mirrored chunks per CP rank); e.g. 28 or 32"),
    ],
)  # fmt: skip
def test_bad_context_layouts_are_named(world: int, parallel: dict, seq: int, message: str) -> None:
    config = tiny_config(**parallel)
    config = replace(config, data=replace(config.data, seq_length=seq))
    p = config.parallel
    with pytest.raises(ValueError, match=re.escape(message)):
        layout = resolve_layout(p.tensor, p.data, world, p.pipeline, p.context)
        validate(config, layout)


def test_inference_refuses_context_parallelism() -> None:
    with pytest.raises(ValueError, match=r"parallel.context=2: generation and evaluation"):
        validate_layout_for_inference(ParallelConfig(context=2), Layout(dp=1, tp=1, cp=2))


def _widths(ctx: ParallelContext) -> tuple[int, int, str]:
    try:
        batch_width_multiple(3, 62, ctx, 64)
        error = ""
    except ValueError as err:
        error = str(err)
    return batch_width_multiple(3, 40, ctx, 64), batch_width_multiple(8, 40, ctx, 64), error


def test_fine_tuning_pads_batches_to_the_context_multiple() -> None:
    """CP=2: every batch width a multiple of 2 x cp = 4 as well as data.pad_to_multiple_of."""
    for lcm, kept, error in run_distributed(_widths, 2, context=2):
        assert (lcm, kept) == (12, 8)
        assert "data.max_length=62 padded to a multiple of 12 is 72" in error
