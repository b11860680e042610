"""parallel.rng=fast: Megatron-style dropout streams. Each site drops about p; replicated regions
get the same mask on every TP rank and sharded ones (heads, sequence chunks) their own; a run
repeats bit for bit; the default generator is left as it was; a resumed run continues the
streams. Training in each layout under fast: tests/engine/test_compile.py."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from tests.dist import run_distributed
from tests.models.common import tiny_bert
from tests.pipeline.test_pipeline_training import EXIT, STEPS, _save_then_resume, pipeline_config
from tpformer.layers.attention import ParallelSelfAttention
from tpformer.layers.dropout import ParallelDropout
from tpformer.models import build_model
from tpformer.parallel.context import ParallelContext
from tpformer.parallel.random import RNGTracker, resolve_rng_mode

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
    whole = ParallelDropout(P, ctx.rng)
    whole.site = 12345
    masks["whole_sequence"] = whole(torch.ones(BATCH, SEQ, 32)) > 0
    return masks


def test_every_site_keeps_one_minus_p_within_three_sigma() -> None:
    masks = _site_masks(ParallelContext.single(seed=7, device="cpu", rng="fast"))
    assert len(masks) == 9  # embeddings + 2 per layer x 2 layers, 2 cores, SP and its whole
    for name, keep in masks.items():
        sigma = math.sqrt(P * (1 - P) / keep.numel())
        rate = keep.float().mean().item()
        assert abs(rate - (1 - P)) <= 3 * sigma, (name, rate, sigma)
    # different sites, different masks
    embeddings, mlp = masks["bert.embeddings.dropout"], masks["bert.encoder.layers.0.mlp_dropout"]
    assert not torch.equal(embeddings, mlp)


def test_tp_ranks_share_replicated_masks_and_draw_their_own_sharded_ones() -> None:
    """TP=2 x DP=2: the two TP ranks of a DP rank agree on the replicated sites and differ on
    the heads and sequence chunks they hold; a sequence-parallel chunk is its rows of the whole
    sequence's mask (hash masks are keyed by global position); DP ranks (other samples) differ
    everywhere. One process's masks of DP rank 1's samples equal DP rank 1's."""
    ranks = run_distributed(_site_masks, 4, tensor=2, seed=7, rng="fast")
    for name in ranks[0]:
        sharded = name.endswith(".core") or name == "sequence_parallel"
        for dp in range(2):
            first, second = ranks[2 * dp][name], ranks[2 * dp + 1][name]
            assert torch.equal(first, second) != sharded, (name, dp)
        assert not torch.equal(ranks[0][name], ranks[2][name]), name
    for dp in range(2):
        chunks = [ranks[2 * dp + tp]["sequence_parallel"] for tp in range(2)]
        assert torch.equal(torch.cat(chunks, dim=1), ranks[2 * dp]["whole_sequence"])
    one = _site_masks(ParallelContext.single(seed=7, device="cpu", rng="fast"))
    assert torch.equal(one["whole_sequence"], ranks[0]["whole_sequence"])
    assert torch.equal(one["bert.embeddings.dropout"], ranks[0]["bert.embeddings.dropout"])


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


def test_a_resumed_fast_run_continues_the_same_streams(tmp_path: Path) -> None:
    """The streams are keyed by the step, so a run stopped at step 2 and resumed draws the
    masks the uninterrupted run drew: bitwise equal losses."""
    ctx = ParallelContext.single(device="cpu", rng="fast")
    whole, resumed = _save_then_resume(
        ctx, pipeline_config(), str(tmp_path / "a"), str(tmp_path / "b")
    )
    assert min(resumed) == EXIT + 1
    assert all(resumed[step] == whole[step] for step in range(EXIT + 1, STEPS + 1))
