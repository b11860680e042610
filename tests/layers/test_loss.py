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
