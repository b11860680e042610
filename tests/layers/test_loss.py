"""vocab_parallel_cross_entropy against F.cross_entropy on the gathered logits."""

import pytest
import torch
import torch.nn.functional as F

from tests.dist import run_distributed
from tests.tolerances import FP32_LAYER_REL, assert_rel_close, seeded
from tpformer.layers.loss import vocab_parallel_cross_entropy
from tpformer.parallel.comm import count_collectives
from tpformer.parallel.context import ParallelContext

N = 7


def _loss(ctx: ParallelContext, vocab: int, padded: int, smoothing: float) -> dict[str, int]:
    tp = ctx.tp
    logits = torch.randn(N, padded, generator=seeded(0)) * 3
    target = torch.randint(0, vocab, (N,), generator=seeded(1))
    target[2] = -100
    if vocab <= padded // tp.size * (tp.size - 1):  # some rank holds no target: put one there
        target[3] = vocab - 1
    chunk = padded // tp.size
    local = logits[:, tp.rank * chunk : (tp.rank + 1) * chunk].clone().requires_grad_()
    with count_collectives() as forward:
        loss = vocab_parallel_cross_entropy(
            local, target, tp, vocab_size=vocab, label_smoothing=smoothing
        )
    weights = torch.rand(N, generator=seeded(2))
    with count_collectives() as backward:
        (loss * weights).sum().backward()
    ref_logits = logits[:, :vocab].clone().requires_grad_()
    ref = F.cross_entropy(ref_logits, target, reduction="none", label_smoothing=smoothing)
    (ref * weights).sum().backward()
    assert_rel_close(loss, ref, FP32_LAYER_REL, "loss")
    ref_grad = torch.cat([ref_logits.grad, torch.zeros(N, padded - vocab)], dim=1)
    assert_rel_close(
        local.grad,
        ref_grad[:, tp.rank * chunk : (tp.rank + 1) * chunk],
        FP32_LAYER_REL,
        "logit grad",
    )
    assert torch.count_nonzero(local.grad[2]) == 0, "ignored row got gradient"
    return {"forward": forward["all_reduce"], "backward": sum(backward.values())}


@pytest.mark.parametrize("tp", [1, 2, 4])
@pytest.mark.parametrize(
    ("vocab", "padded", "smoothing"), [(32, 32, 0.0), (29, 32, 0.0), (29, 32, 0.1), (20, 32, 0.0)]
)
def test_vocab_parallel_cross_entropy_matches_reference(
    tp: int, vocab: int, padded: int, smoothing: float
) -> None:
    for counts in run_distributed(_loss, tp, vocab, padded, smoothing, tensor=tp):
        assert counts == {"forward": 3 if tp > 1 else 0, "backward": 0}


def test_bad_shapes_raise() -> None:
    from tpformer.parallel.handle import GroupHandle

    with pytest.raises(ValueError, match="expected logits"):
        vocab_parallel_cross_entropy(
            torch.zeros(3, 4, 5),
            torch.zeros(3, dtype=torch.long),
            GroupHandle.single(),
            vocab_size=5,
        )
    with pytest.raises(ValueError, match="fewer than vocab_size=9"):
        vocab_parallel_cross_entropy(
            torch.zeros(3, 8), torch.zeros(3, dtype=torch.long), GroupHandle.single(), vocab_size=9
        )


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_the_loss_upcasts_a_chunk_of_rows_at_a_time(
    smoothing: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Chunks of 2 rows (CHUNK_ELEMENTS lowered to 64 over 32 columns) give F.cross_entropy's
    loss and gradient (fp32, 1e-6); with bf16 logits nothing fp32 of the logits' size is kept
    for backward (the logits themselves are, in bf16), the loss is the fp32 loss of the same
    bf16 values (1e-6) and the gradient comes back in bf16, within its rounding (2^-8)."""
    import tpformer.layers.loss as loss_module
    from tpformer.parallel.handle import GroupHandle

    monkeypatch.setattr(loss_module, "CHUNK_ELEMENTS", 64)
    assert len(loss_module.row_chunks(N, 32)) == 4
    logits = (torch.randn(N, 32, generator=seeded(0)) * 3).to(torch.bfloat16)
    target = torch.randint(0, 29, (N,), generator=seeded(1))
    target[2] = -100
    for dtype in (torch.float32, torch.bfloat16):
        ours = logits.to(dtype).clone().requires_grad_()
        kept: list[tuple[torch.dtype, tuple[int, ...]]] = []

        def pack(t: torch.Tensor, kept: list = kept) -> torch.Tensor:
            kept.append((t.dtype, tuple(t.shape)))
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            loss = vocab_parallel_cross_entropy(
                ours, target, GroupHandle.single(), vocab_size=29, label_smoothing=smoothing
            )
        assert (torch.float32, (N, 32)) not in kept or dtype == torch.float32, kept
        loss.sum().backward()
        reference = logits.float()[:, :29].clone().requires_grad_()
        expected = F.cross_entropy(reference, target, reduction="none", label_smoothing=smoothing)
        expected.sum().backward()
        assert_rel_close(loss, expected, FP32_LAYER_REL, f"{dtype} loss")
        grad = torch.cat([reference.grad, torch.zeros(N, 3)], dim=1)
        assert ours.grad is not None and ours.grad.dtype == dtype
        rel = FP32_LAYER_REL if dtype == torch.float32 else 2.0**-8
        assert_rel_close(ours.grad.float(), grad, rel, f"{dtype} logit grad")
