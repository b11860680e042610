"""VocabParallelEmbedding against nn.Embedding, with and without vocabulary padding."""

import pytest
import torch
from torch import nn

from tests.dist import run_distributed
from tests.tolerances import FP32_LAYER_REL, assert_rel_close, seeded
from tpformer.layers.embedding import VocabParallelEmbedding, padded_vocab_size
from tpformer.parallel.context import ParallelContext
from tpformer.parallel.init import gather_full


def _embedding(ctx: ParallelContext, vocab: int, pad_to: int) -> None:
    tp = ctx.tp
    torch.manual_seed(0)
    ref = nn.Embedding(vocab, 8)
    layer = VocabParallelEmbedding(vocab, 8, tp, pad_to_multiple_of=pad_to)
    layer.load_full_state_dict(ref.state_dict())
    ids = torch.randint(0, vocab, (3, 5), generator=seeded(1))
    grad_out = torch.randn(3, 5, 8, generator=seeded(2))
    out, out_ref = layer(ids), ref(ids)
    out.backward(grad_out)
    out_ref.backward(grad_out)
    assert_rel_close(out, out_ref, FP32_LAYER_REL, "output")
    # Gradient of the padded table: the real rows match, padding rows stay exactly zero.
    full_grad = layer.weight.grad
    start = layer.vocab_start
    stop = min(start + layer.rows_per_rank, vocab)
    real = max(0, stop - start)
    assert_rel_close(full_grad[:real], ref.weight.grad[start:stop], FP32_LAYER_REL, "grad rows")
    assert torch.count_nonzero(full_grad[real:]) == 0, "padding rows received gradient"
    assert torch.equal(gather_full(layer.weight, tp), ref.weight.detach())


@pytest.mark.parametrize("tp", [1, 2, 4])
@pytest.mark.parametrize(("vocab", "pad_to"), [(32, 0), (29, 4)])
def test_vocab_parallel_embedding_matches_embedding(tp: int, vocab: int, pad_to: int) -> None:
    run_distributed(_embedding, tp, vocab, pad_to, tensor=tp)


def test_padding_rounds_to_multiple_times_tp() -> None:
    assert padded_vocab_size(30522, 1, 128) == 30592
    assert padded_vocab_size(30522, 4, 128) == 30720
    assert padded_vocab_size(32, 4, 0) == 32
    with pytest.raises(
        ValueError, match=r"vocab_size=30522 is not divisible by tp=4; set model.pad_vocab_to"
    ):
        padded_vocab_size(30522, 4, 0)
