"""trainer.compile under parallel.rng=fast: a block is one graph with no breaks (its dropout masks
are integer hashes traced into the graph, its attention dropout SDPA's own draw, seeded before
the block runs), the hash masks have the same bits compiled and eager and keep 1 - p of every
site, and recomputation and resume replay them: compiled runs with full recomputation equal
those without bit for bit, and a stopped-and-resumed compiled run equals the uninterrupted one.
Under exact the per-sample draws stay eager islands (several graphs per block).
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from torch._dynamo.utils import counters

from tests.dist import run_distributed
from tests.models.common import bert_batch, tiny_bert, tiny_gpt
from tests.train.test_fast_invariance import _config, _losses, _stop_then_resume
from tpformer.engine.compiled import apply_compile
from tpformer.engine.precision import use_fp8_linears
from tpformer.engine.units import model_blocks
from tpformer.models import build_model
from tpformer.parallel.context import ParallelContext
from tpformer.parallel.random import keep_mask

P = 0.1


def _graphs(ctx: ParallelContext, arch: str, fp8: bool = False) -> tuple[int, int]:
    """(graphs, breaks) dynamo captures of one block's forward in training (`fp8`: bf16 with
    the block's linears in fp8, as the engine sets them under parallel.precision=fp8)."""
    config = tiny_bert(P) if arch == "bert" else tiny_gpt(P)
    model = build_model(config, ctx, task="pretraining" if arch == "bert" else "causal_lm")
    model.train()
    dtype = torch.bfloat16 if fp8 else torch.float32
    if fp8:
        model.to(dtype)
        use_fp8_linears(model, ctx)
    apply_compile(model, ctx.rng)  # what trainer.compile applies (seeding + inductor settings)
    block = model_blocks(model)[0]
    ctx.rng.set_position(step=3, sample_offset=0)
    rows = 16 // ctx.tp.size if ctx.sequence_parallel else 16
    x = torch.randn(4, rows, 32, requires_grad=True, dtype=dtype)
    torch._dynamo.reset()
    original = type(block).__bases__[0].forward  # apply_compile gave it a Compiled subclass
    explained = torch._dynamo.explain(original)(block, x)
    return explained.graph_count, explained.graph_break_count


@pytest.mark.slow  # dynamo traces each block: about 10 s per case on 2 cores
@pytest.mark.parametrize("arch", ["bert", "gpt"])
@pytest.mark.parametrize(("tp", "sp"), [(1, False), (2, False), (2, True)])
def test_a_fast_mode_block_is_one_graph_without_breaks(arch: str, tp: int, sp: bool) -> None:
    """TP's collectives are functional collectives inside the graph (parallel/comm.traced);
    with sequence parallelism the block's input is its sequence chunk [b, s/tp, h]."""
    if tp == 1:
        ranks = [_graphs(ParallelContext.single(device="cpu", rng="fast"), arch)]
    else:
        ranks = run_distributed(_graphs, tp, arch, tensor=tp, sequence_parallel=sp, rng="fast")
    for graphs, breaks in ranks:
        assert (graphs, breaks) == (1, 0)


@pytest.mark.slow  # two ranks trace a block
def test_an_fp8_block_is_one_graph_without_breaks() -> None:
    """fp8's amax all-reduces over TP (and its fp8 casts and scaled matmuls) stay inside the
    block's graph, under sequence parallelism too (measured the same at TP=1)."""
    ranks = run_distributed(_graphs, 2, "bert", True, tensor=2, sequence_parallel=True, rng="fast")
    for graphs, breaks in ranks:
        assert (graphs, breaks) == (1, 0)


@pytest.mark.slow
def test_every_block_and_step_reuses_the_one_graph() -> None:
    """6 blocks x 2 steps (new positions): one graph compiled in all. The step and the site
    enter as tensors, so no block or step recompiles (past torch's recompile limit a block
    would silently run eagerly)."""
    ctx = ParallelContext.single(device="cpu", rng="fast")
    model = build_model(tiny_bert(P, num_layers=6), ctx, task="pretraining").train()
    apply_compile(model, ctx.rng)
    torch._dynamo.reset()
    counters.clear()
    for step in range(2):
        ctx.rng.set_position(step, sample_offset=4 * step)
        model(**bert_batch()).loss.backward()
    assert counters["stats"]["unique_graphs"] == 1


@pytest.mark.slow
def test_an_exact_mode_block_keeps_its_eager_islands() -> None:
    graphs, breaks = _graphs(ParallelContext.single(device="cpu", rng="exact"), "bert")
    assert graphs > 1 and breaks > 0


@pytest.mark.slow  # over ~5 s: the slow tier
def test_hash_masks_have_the_same_bits_compiled_and_keep_one_minus_p() -> None:
    """keep_mask compiled by inductor (as inside a compiled block) against its eager ops, over
    [8, 64, 96] (49k draws): identical bits; keep rate within 3 sigma of 1 - p; and samples,
    sites and steps get masks of their own."""
    step, first, site = (torch.tensor(v) for v in (1234567, 40, 99))
    positions = torch.arange(64)
    shape = (8, 64, 96)
    eager = keep_mask(step, first, site, positions, shape, P)
    compiled = torch.compile(keep_mask, dynamic=True)(step, first, site, positions, shape, P)
    assert torch.equal(eager, compiled)
    sigma = math.sqrt(P * (1 - P) / eager.numel())
    assert abs(eager.float().mean().item() - (1 - P)) <= 3 * sigma
    assert not torch.equal(eager[0], eager[1])
    other_site = keep_mask(step, first, torch.tensor(100), positions, shape, P)
    other_step = keep_mask(torch.tensor(7654321), first, site, positions, shape, P)
    for other in (other_site, other_step):
        agree = (other == eager).float().mean().item()  # independent masks: 1 - 2p(1 - p)
        assert abs(agree - (1 - 2 * P * (1 - P))) <= 5 * math.sqrt(0.18 * 0.82 / eager.numel())
    # the same sample at another micro-batch offset gets the same mask (keyed by sample)
    shifted = keep_mask(step, torch.tensor(41), site, positions, shape, P)
    assert torch.equal(shifted[:-1], eager[1:])


@pytest.mark.slow  # two compiled runs
def test_compiled_full_recomputation_equals_no_recomputation_bit_for_bit(tmp_path: Path) -> None:
    ctx = ParallelContext.single(device="cpu", rng="fast")
    plain = _losses(ctx, _config("bert", 1, {}, {"compile": True}), str(tmp_path / "a"))
    full = {"recompute": "full"}
    recomputed = _losses(ctx, _config("bert", 1, full, {"compile": True}), str(tmp_path / "b"))
    assert recomputed == plain


@pytest.mark.slow
def test_a_resumed_compiled_run_equals_the_uninterrupted_one(tmp_path: Path) -> None:
    ctx = ParallelContext.single(device="cpu", rng="fast")
    config = _config("bert", 1, {}, {"compile": True})
    whole = _losses(ctx, config, str(tmp_path / "a"))
    resumed = _stop_then_resume(ctx, replace(config), str(tmp_path / "b"))
    assert resumed == whole
