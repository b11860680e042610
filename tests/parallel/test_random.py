"""Layout-independent randomness: dropout masks and weight init do not depend on tp or dp."""

import pytest
import torch
from torch import nn

from tests.dist import run_distributed
from tpformer.layers.dropout import ParallelDropout, _ApplyMask, assign_dropout_sites
from tpformer.layers.embedding import VocabParallelEmbedding
from tpformer.layers.linear import ColumnParallelLinear, RowParallelLinear
from tpformer.parallel.context import ParallelContext
from tpformer.parallel.handle import GroupHandle
from tpformer.parallel.init import full_state_dict, initialize_parameters
from tpformer.parallel.random import RNGTracker, derive_seed

BATCH, HEADS, SEQ, HIDDEN = 4, 4, 5, 6


class _Dropouts(nn.Module):
    def __init__(self, rng: RNGTracker) -> None:
        super().__init__()
        self.attention = ParallelDropout(0.3, rng, heads=HEADS)
        self.hidden = ParallelDropout(0.3, rng)


def _masks(ctx: ParallelContext) -> tuple[torch.Tensor, torch.Tensor]:
    """Each rank drops its own heads (TP) of its own samples (DP); returns this rank's slices."""
    module = _Dropouts(ctx.rng)
    assign_dropout_sites(module)
    per_dp = BATCH // ctx.dp.size
    heads = HEADS // ctx.tp.size
    ctx.rng.set_position(step=7, sample_offset=ctx.dp.rank * per_dp)
    probs = module.attention(torch.ones(per_dp, heads, SEQ, SEQ), head_offset=ctx.tp.rank * heads)
    hidden = module.hidden(torch.ones(per_dp, SEQ, HIDDEN))
    return probs, hidden


def _assemble(results: list, tp: int, dp: int) -> tuple[torch.Tensor, torch.Tensor]:
    probs = torch.cat(
        [torch.cat([results[d * tp + t][0] for t in range(tp)], dim=1) for d in range(dp)], dim=0
    )
    hidden = torch.cat([results[d * tp][1] for d in range(dp)], dim=0)
    for d in range(dp):  # replicated regions agree across the TP group
        assert all(torch.equal(results[d * tp + t][1], results[d * tp][1]) for t in range(tp))
    return probs, hidden


@pytest.mark.parametrize(("world", "tp"), [(2, 2), (4, 4), (2, 1), (4, 2)])
def test_dropout_masks_are_the_same_in_every_layout(world: int, tp: int) -> None:
    reference = _masks(ParallelContext.single(seed=5, device="cpu"))
    probs, hidden = _assemble(run_distributed(_masks, world, tensor=tp, seed=5), tp, world // tp)
    assert torch.equal(probs, reference[0])
    assert torch.equal(hidden, reference[1])
    assert 0.5 < (reference[0] == 0).float().mean() / 0.3 < 1.5  # it does drop about p


def test_masks_do_not_depend_on_the_micro_batch_padding() -> None:
    """A sample padded to 6 tokens (its micro-batch's longest) gets the top-left corner of the
    masks it gets padded to 9 (the step's widest micro-batch), on all heads or a TP rank's."""
    rng = RNGTracker(5)
    module = _Dropouts(rng)
    assign_dropout_sites(module)
    rng.set_position(step=3, sample_offset=10)
    rng.mask_width = 9
    wide = module.attention(torch.ones(2, HEADS, 9, 9))
    assert torch.equal(module.attention(torch.ones(2, HEADS, 6, 6)), wide[:, :, :6, :6])
    half = HEADS // 2
    assert torch.equal(
        module.attention(torch.ones(2, half, 6, 6), head_offset=half), wide[:, half:, :6, :6]
    )
    hidden = module.hidden(torch.ones(2, 9, HIDDEN))
    assert torch.equal(module.hidden(torch.ones(2, 6, HIDDEN)), hidden[:, :6])


def test_the_cpu_float_mask_gives_the_bits_of_a_bool_mask() -> None:
    """On CPU the mask is kept as float32 0-or-scale (faster than converting a bool); output
    and input gradient equal x * keep * scale with a bool mask, bit for bit, and it drops."""
    rng = RNGTracker(5)
    module = _Dropouts(rng)
    assign_dropout_sites(module)
    rng.set_position(step=2)
    x = torch.randn(BATCH, SEQ, HIDDEN, requires_grad=True)
    out = module.hidden(x)
    keep = out != 0
    scale = 1.0 / 0.7
    assert 0.5 < (~keep).float().mean() / 0.3 < 1.5
    x_bool = x.detach().clone().requires_grad_()
    out_bool = _ApplyMask.apply(x_bool, keep, scale)
    assert torch.equal(out, out_bool)
    grad = torch.randn_like(out)
    out.backward(grad)
    out_bool.backward(grad)
    assert torch.equal(x.grad, x_bool.grad)
    assert torch.equal(x_bool.grad, torch.mul(grad, keep).mul_(scale))


def test_masks_change_with_step_site_and_seed() -> None:
    assert len({derive_seed(1, 2, 3), derive_seed(1, 3, 2), derive_seed(2, 2, 3)}) == 3
    ctx = ParallelContext.single(seed=5, device="cpu")
    first = _masks(ctx)[1]
    ctx.rng.set_position(8)
    module = _Dropouts(ctx.rng)
    assign_dropout_sites(module)
    assert not torch.equal(module.hidden(torch.ones(BATCH, SEQ, HIDDEN)), first)


class _Tiny(nn.Module):
    def __init__(self, tp: GroupHandle) -> None:
        super().__init__()
        self.embed = VocabParallelEmbedding(30, 8, tp, pad_to_multiple_of=4)
        self.up = ColumnParallelLinear(8, 16, tp)
        self.down = RowParallelLinear(16, 8, tp)
        self.norm = nn.LayerNorm(8)


def _init(ctx: ParallelContext) -> dict[str, torch.Tensor]:
    model = _Tiny(ctx.tp)
    initialize_parameters(model, ctx.rng, ctx.tp, std=0.02)
    return full_state_dict(model, ctx.tp)


@pytest.mark.parametrize("tp", [2, 4])
def test_initialization_is_bitwise_layout_independent(tp: int) -> None:
    ctx = ParallelContext.single(seed=9, device="cpu")
    model = _Tiny(ctx.tp)
    initialize_parameters(model, ctx.rng, ctx.tp, std=0.02)
    reference = full_state_dict(model, ctx.tp)
    for full in run_distributed(_init, tp, tensor=tp, seed=9):
        assert full.keys() == reference.keys()
        for name, tensor in reference.items():
            assert torch.equal(full[name], tensor), name
    assert torch.equal(reference["norm.weight"], torch.ones(8))
    assert reference["up.weight"].std().item() == pytest.approx(0.02, rel=0.3)
