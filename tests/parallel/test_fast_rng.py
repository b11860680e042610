"""parallel.rng=fast: Megatron-style dropout streams. Each site drops about p; replicated regions
get the same mask on every TP rank and sharded ones (heads, sequence chunks) their own; a run
repeats bit for bit; the default generator is left as it was; every layout trains with it."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from tests.dist import run_distributed
from tests.models.common import tiny_bert
from tests.pipeline.test_pipeline_training import EXIT, STEPS, _save_then_resume, pipeline_config
from tpformer.config.schema import Config
from tpformer.layers.attention import ParallelSelfAttention
from tpformer.layers.dropout import ParallelDropout
from tpformer.models import build_model
from tpformer.parallel.context import GroupHandle, ParallelContext
from tpformer.parallel.random import RNGTracker, resolve_rng_mode
from tpformer.train.pretraining import pretraining_trainer

P = 0.1
BATCH, SEQ = 8, 64


def _model(ctx: ParallelContext) -> torch.nn.Module:
    model = build_model(tiny_bert(P), ctx, task="pretraining")
    return model.train()


def _attention_keep(attention: ParallelSelfAttention, heads: int) -> torch.Tensor:
    """The core's keep mask read off its output: with q = k = 0 every probability is 1/SEQ, and
    with v the identity out[q, k] = keep[q, k] / ((1 - p) * SEQ)."""
    q = torch.zeros(BATCH, heads, SEQ, SEQ)
    v = torch.eye(SEQ).expand(BATCH, heads, SEQ, SEQ)
    return attention.core(q, q, v, None, causal=False) > 0


def _site_masks(ctx: ParallelContext) -> dict[str, torch.Tensor]:
    """Each dropout site's keep mask on this rank at one position (step 3, this DP rank's
    samples), plus the attention cores' and one sequence-parallel region's."""
    model = _model(ctx)
    ctx.rng.set_position(step=3, sample_offset=ctx.dp.rank * BATCH)
    masks = {}
    for name, module in model.named_modules():
        if isinstance(module, ParallelDropout) and module.heads is None:
            masks[name] = module(torch.ones(BATCH, SEQ, 32)) > 0
        if isinstance(module, ParallelSelfAttention):
            masks[f"{name}.core"] = _attention_keep(module, module.local_heads)
    chunked = ParallelDropout(P, ctx.rng, sequence=ctx.tp)
    chunked.site = 12345
    masks["sequence_parallel"] = chunked(torch.ones(BATCH, SEQ // ctx.tp.size, 32)) > 0
    return masks


def test_every_site_keeps_one_minus_p_within_three_sigma() -> None:
    masks = _site_masks(ParallelContext.single(seed=7, device="cpu", rng="fast"))
    assert len(masks) == 8  # embeddings + 2 per layer x 2 layers, 2 attention cores, one SP
    for name, keep in masks.items():
        sigma = math.sqrt(P * (1 - P) / keep.numel())
        rate = keep.float().mean().item()
        assert abs(rate - (1 - P)) <= 3 * sigma, (name, rate, sigma)
    # different sites, different masks
    embeddings, mlp = masks["bert.embeddings.dropout"], masks["bert.encoder.layers.0.mlp_dropout"]
    assert not torch.equal(embeddings, mlp)


def test_tp_ranks_share_replicated_masks_and_draw_their_own_sharded_ones() -> None:
    """TP=2 x DP=2: the two TP ranks of a DP rank agree on the replicated sites and differ on
    the heads and sequence chunks they hold; DP ranks (other samples) differ everywhere."""
    ranks = run_distributed(_site_masks, 4, tensor=2, seed=7, rng="fast")
    for name in ranks[0]:
        sharded = name.endswith(".core") or name == "sequence_parallel"
        for dp in range(2):
            first, second = ranks[2 * dp][name], ranks[2 * dp + 1][name]
            assert torch.equal(first, second) != sharded, (name, dp)
        assert not torch.equal(ranks[0][name], ranks[2][name]), name


def test_fast_repeats_bit_for_bit_and_leaves_the_default_generator_alone() -> None:
    ctx = ParallelContext.single(seed=7, device="cpu", rng="fast")
    model = _model(ctx)
    ids = torch.randint(5, 99, (4, 16), generator=torch.Generator().manual_seed(1))

    def loss(step: int) -> torch.Tensor:
        ctx.rng.set_position(step=step)
        return model(ids, mlm_labels=ids, nsp_labels=torch.zeros(4, dtype=torch.long)).loss

    torch.manual_seed(0)
    first = loss(1)
    after = torch.rand(3)
    torch.manual_seed(0)
    assert torch.equal(after, torch.rand(3))  # dropout seeded its own streams and restored ours
    assert torch.equal(loss(1), first)
    assert not torch.equal(loss(2), first)  # a new step, new masks
    model.eval()
    assert torch.equal(loss(1), loss(2))  # no dropout in eval


def test_auto_is_exact_on_the_cpu_and_fast_on_an_accelerator() -> None:
    assert resolve_rng_mode("auto", torch.device("cpu")) == "exact"
    assert resolve_rng_mode("auto", torch.device("cuda", 0)) == "fast"
    assert resolve_rng_mode("fast", torch.device("cpu")) == "fast"
    assert ParallelContext.single(device="cpu").rng.mode == "exact"
    with pytest.raises(ValueError, match="expected auto, exact or fast"):
        resolve_rng_mode("quick", torch.device("cpu"))
    with pytest.raises(ValueError, match="'auto'"):
        RNGTracker(1, "auto")
    assert GroupHandle.single().size == 1


LAYOUTS = [  # (world, run_distributed kwargs, parallel keys, micro, accum)
    (2, {"tensor": 2}, {}, 8, 1),
    (2, {"tensor": 2, "sequence_parallel": True}, {}, 8, 1),
    (4, {"tensor": 2}, {"zero_stage": 1, "activation_checkpointing": "full"}, 4, 1),
    (2, {}, {"zero_stage": 3, "activation_checkpointing": "selective"}, 4, 1),
    (2, {"pipeline": 2}, {}, 2, 4),
]
FAST_NOISE = 0.02
"""Relative distance allowed between a layout's fast-mode losses and the one-process run's:
other masks give other losses, by about the dropout noise (measured over these 3 steps: at most
0.49% (TP=2 + SP), against 0.41% between exact and fast at TP=1; plain TP=2 0.006%, since only
the heads' masks differ from one process's)."""


def _fast_run(ctx: ParallelContext, config: Config, run_dir: str) -> tuple[list[float], dict]:
    """Losses, and the LayerNorm weights (replicated over TP, gradients not reduced over TP
    without sequence parallelism) when this rank holds them whole."""
    trainer = pretraining_trainer(config, ctx, Path(run_dir))
    losses = [r["loss"] for r in trainer.train()]
    norms = {}
    if ctx.tp.size > 1 and config.parallel.zero_stage < 3:
        norms = {n: p.detach().clone() for n, p in trainer.model.named_parameters() if "norm" in n}
    return losses, norms


@pytest.mark.parametrize(("world", "layout", "keys", "micro", "accum"), LAYOUTS)
def test_every_layout_trains_with_fast_streams(
    tmp_path: Path, world: int, layout: dict, keys: dict, micro: int, accum: int
) -> None:
    """Global batch 8, dropout 0.1, 3 steps: losses near the one-process fast run's; the TP
    ranks' replicated parameters stay bitwise equal (their masks are shared)."""
    base = pipeline_config(micro=8)
    reference = _fast_run(ParallelContext.single(device="cpu", rng="fast"), base, str(tmp_path))
    config = pipeline_config(micro=micro, accum=accum, **keys, **layout)
    ranks = run_distributed(_fast_run, world, config, str(tmp_path / "run"), rng="fast", **layout)
    for losses, _ in ranks:
        for got, want in zip(losses, reference[0], strict=True):
            assert abs(got - want) <= FAST_NOISE * want, (losses, reference[0])
    tp = layout.get("tensor", 1)
    for first in range(0, world, tp):  # each TP group's ranks hold the same replicated weights
        for rank in range(first + 1, first + tp):
            norms, others = ranks[first][1], ranks[rank][1]
            assert norms and norms.keys() == others.keys()
            assert all(torch.equal(norms[n], others[n]) for n in norms), rank


def test_a_resumed_fast_run_continues_the_same_streams(tmp_path: Path) -> None:
    """The streams are keyed by the step, so a run stopped at step 2 and resumed draws the
    masks the uninterrupted run drew: bitwise equal losses."""
    ctx = ParallelContext.single(device="cpu", rng="fast")
    whole, resumed = _save_then_resume(
        ctx, pipeline_config(), str(tmp_path / "a"), str(tmp_path / "b")
    )
    assert min(resumed) == EXIT + 1
    assert all(resumed[step] == whole[step] for step in range(EXIT + 1, STEPS + 1))
