"""Ring attention (context parallelism) against the one-process attention core.

Each CP rank holds its two mirrored chunks of q, k and v; the outputs and the gradients of its
rows must equal the one-process explicit core's, causal and padded, with exact-mode attention
dropout on (the same masks: keyed by global head, query and key position).
"""

from __future__ import annotations

import pytest
import torch

from tests.dist import run_distributed
from tests.tolerances import FP32_LAYER_REL, assert_rel_close, rel_err, seeded
from tpformer.layers.attention import ParallelSelfAttention
from tpformer.layers.dropout import assign_dropout_sites
from tpformer.parallel.comm import all_reduce, count_collectives
from tpformer.parallel.context import ParallelContext
from tpformer.parallel.sequence_chunks import context_positions, within_reach

B, HEADS, SEQ, HIDDEN = 2, 4, 16, 32
DIM = HIDDEN // HEADS


def _inputs(window: int = 0) -> dict[str, torch.Tensor]:
    """q, k, v, the output's gradient and a padding mask: the second sample has 5 padding
    positions, or with a `window` as many as keep every query a token within its reach (a
    padding query out of every token's reach attends to nothing: the ring and SDPA give it
    zeros, the explicit core HF's uniform row; in a model it carries no loss either way)."""
    gen = seeded(7)
    q, k, v, grad = (torch.randn(B, HEADS, SEQ, DIM, generator=gen) for _ in range(4))
    lengths = torch.tensor([SEQ, SEQ - (min(5, window // 2) if window else 5)])
    padding = torch.arange(SEQ)[None, :] < lengths[:, None]  # [b, s], True = token
    return {"q": q, "k": k, "v": v, "grad": grad, "padding": padding}


def _layer(
    ctx: ParallelContext, causal: bool, dropout: float, window: int = 0
) -> ParallelSelfAttention:
    layer = ParallelSelfAttention(
        HIDDEN, HEADS, ctx, attention_dropout=dropout, causal=causal, window=window
    )
    assign_dropout_sites(layer)
    ctx.rng.set_position(step=3, sample_offset=5)
    return layer.train()


def _masks(padding: torch.Tensor, causal: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(the one-process mask [b, 1, s, s], the ring's key padding mask [b, 1, 1, s])."""
    keys = padding[:, None, None, :]
    full = keys.expand(B, 1, SEQ, SEQ)
    if causal:
        full = full & torch.ones(SEQ, SEQ, dtype=torch.bool).tril()
    return full, keys


def _run(ctx: ParallelContext, causal: bool, dropout: float, window: int = 0) -> dict[str, object]:
    data = _inputs(window)
    layer = _layer(ctx, causal, dropout, window)
    heads = slice(layer.head_offset, layer.head_offset + layer.local_heads)
    rows = context_positions(SEQ, ctx.cp.rank, ctx.cp.size, torch.device("cpu"))
    q, k, v = (data[n][:, heads][:, :, rows].clone().requires_grad_() for n in "qkv")
    _, keys = _masks(data["padding"], causal)
    with count_collectives() as counts:
        out = layer.core(q, k, v, keys, causal)
        out.backward(data["grad"][:, heads][:, :, rows])
    assert q.grad is not None and k.grad is not None and v.grad is not None
    return {
        "out": out.detach(),
        "grads": [q.grad, k.grad, v.grad],
        "rows": rows,
        "heads": heads,
        "sent": counts.bytes["send"],
    }


def _reference(causal: bool, dropout: float, window: int = 0) -> dict[str, object]:
    data = _inputs(window)
    layer = _layer(ParallelContext.single(rng="exact", device="cpu"), causal, dropout, window)
    q, k, v = (data[n].clone().requires_grad_() for n in "qkv")
    full, _ = _masks(data["padding"], causal)
    out = layer.core(q, k, v, full, causal)
    out.backward(data["grad"])
    return {"out": out.detach(), "grads": [q.grad, k.grad, v.grad]}


@pytest.mark.parametrize(
    ("cp", "tp", "causal", "dropout"),
    [
        (2, 1, True, 0.0),
        (2, 1, False, 0.2),
        (4, 1, True, 0.2),
        (4, 1, False, 0.0),
        (2, 2, True, 0.2),
    ],
)
def test_ring_attention_matches_one_process(cp: int, tp: int, causal: bool, dropout: float) -> None:
    _check_against_one_process(cp, tp, causal, dropout, window=0)


@pytest.mark.parametrize(
    ("cp", "tp", "window", "dropout"),
    [(2, 1, 4, 0.2), (4, 1, 4, 0.2), (4, 1, 10, 0.0), (2, 2, 6, 0.2)],
)
def test_a_local_layer_over_the_ring_matches_one_process(
    cp: int, tp: int, window: int, dropout: float
) -> None:
    """A sliding window (ModernBERT's local layers) over the ring: the one-process core bands
    its mask, the ring builds the band from positions and skips the blocks out of reach (at
    CP=4 with window 4, ranks 0 and 2 hold no pair within 2 positions: chunks of 2)."""
    n = SEQ // cp
    skipped = [
        (r, src)
        for r in range(cp)
        for src in range(cp)
        if not within_reach(n, cp, r, src, window // 2)
    ]
    assert bool(skipped) == (cp == 4 and window == 4), skipped
    _check_against_one_process(cp, tp, False, dropout, window=window)


def test_within_reach_is_the_positions_closest_distance() -> None:
    """The host's arithmetic against the positions themselves, for every pair of CP ranks."""
    for cp in (2, 3, 4):
        for seq in (4 * cp, 12 * cp):
            n = seq // cp
            held = [context_positions(seq, r, cp, torch.device("cpu")) for r in range(cp)]
            for rank in range(cp):
                for src in range(cp):
                    closest = int((held[rank][:, None] - held[src][None, :]).abs().min())
                    for reach in range(1, seq):
                        assert within_reach(n, cp, rank, src, reach) == (closest <= reach)


def _check_against_one_process(cp: int, tp: int, causal: bool, dropout: float, window: int) -> None:
    expected = _reference(causal, dropout, window)
    results = run_distributed(_run, cp * tp, causal, dropout, window, context=cp, tensor=tp)
    for rank, got in enumerate(results):
        rows, heads = got["rows"], got["heads"]
        assert_rel_close(
            got["out"], expected["out"][:, heads][:, :, rows], FP32_LAYER_REL, f"rank {rank} out"
        )
        for name, actual, whole in zip("qkv", got["grads"], expected["grads"], strict=True):
            assert_rel_close(
                actual, whole[:, heads][:, :, rows], FP32_LAYER_REL, f"rank {rank} grad {name}"
            )
        # forward: (cp - 1) key/value blocks; backward: as many again plus cp gradient blocks
        # (a window skips blocks' work, not their passage around the ring)
        block = 2 * B * (HEADS // tp) * (SEQ // cp) * DIM * 4  # stacked k and v, fp32 bytes
        assert got["sent"] == (2 * (cp - 1) + cp) * block


def _run_fast(ctx: ParallelContext, moved: bool) -> list[float]:
    """parallel.rng=fast: each block's mask is drawn from its own key, again in backward. The
    rank's rows must equal an explicit core over the whole sequence that applies the same
    masks (asked of the layer's keep function at the forward's position), outputs and
    gradients; returns the errors. `moved`: another micro-batch's forward moves the tracker
    between this forward and its backward, as every pipeline schedule does."""
    data = _inputs()
    layer = _layer(ctx, causal=True, dropout=0.3)
    forward_position = ctx.rng.state_dict()
    rows = context_positions(SEQ, ctx.cp.rank, ctx.cp.size, torch.device("cpu"))
    positions = [context_positions(SEQ, r, ctx.cp.size, torch.device("cpu")) for r in range(2)]
    q, k, v = (data[n][:, :, rows].clone().requires_grad_() for n in "qkv")
    _, keys = _masks(data["padding"], True)
    out = layer.core(q, k, v, keys, True)
    if moved:
        ctx.rng.set_position(step=3, sample_offset=5 + B)  # the next micro-batch's forward
    out.backward(data["grad"][:, :, rows])
    ctx.rng.load_state_dict(forward_position)
    keep, _ = layer.dropout.ring_keep(q, 0, positions, ctx.cp.rank)
    masks = torch.empty(B, HEADS, SEQ // 2, SEQ)
    for src in range(2):
        masks[..., positions[src]] = keep(src)
    assert 0.55 < (masks > 0).float().mean() < 0.85  # p = 0.3 kept ~70%
    full, _ = _masks(data["padding"], True)
    ref_q = data["q"][:, :, rows].clone().requires_grad_()
    ref_k, ref_v = (data[n].clone().requires_grad_() for n in "kv")
    scores = ref_q @ ref_k.transpose(-1, -2) / DIM**0.5
    scores = scores.masked_fill(~full[:, :, rows], float("-inf"))
    ref = (torch.softmax(scores, -1) * masks) @ ref_v
    ref.backward(data["grad"][:, :, rows])
    assert ref_k.grad is not None and ref_v.grad is not None
    # the whole sequence's k/v gradients are summed over the ring: compare this rank's rows
    grads_k = all_reduce(ref_k.grad.clone(), ctx.cp)[:, :, rows]
    grads_v = all_reduce(ref_v.grad.clone(), ctx.cp)[:, :, rows]
    pairs = [(out, ref), (q.grad, ref_q.grad), (k.grad, grads_k), (v.grad, grads_v)]
    return [rel_err(a, b) for a, b in pairs]


@pytest.mark.parametrize("moved", [False, True])
def test_fast_mode_ring_attention_applies_the_same_masks_in_backward(moved: bool) -> None:
    """moved=True is the pipeline case: before the fix the backward drew the next micro-batch's
    masks (outputs still equal, q/k/v gradients off by 0.8-2.3 relative)."""
    for errors in run_distributed(_run_fast, 2, moved, context=2, rng="fast"):
        assert max(errors) <= FP32_LAYER_REL, errors
