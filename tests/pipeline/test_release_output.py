"""A sent stage output is freed on an accelerator and still roots its backward
(parallel/pipeline/runner.release_output, Megatron-LM's deallocate_output_tensor): the
gradients equal those of the kept output, bitwise, for the outputs a stage ends with; a view,
a leaf and an output an operator saved keep their data. The dry run (meta, whose sends are
waited at once as on NCCL) holds the memory side: tests/train/test_dry_run.py compares each
pipeline layout's held activations with the planner, which prices the outputs as freed."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from torch import Tensor, nn

from tpformer.parallel.pipeline.runner import release_output

ENDS: dict[str, Callable[[Tensor, nn.Linear, nn.LayerNorm], Tensor]] = {
    "residual": lambda x, lin, _: x + lin(x),  # a pre-norm block's last add
    "norm": lambda x, lin, norm: norm(x + lin(x)),  # a post-norm block (BERT)
    "saved": lambda x, lin, _: torch.tanh(lin(x)),  # tanh saves its output
}


def _grads(end: str, release: bool) -> tuple[list[Tensor], int]:
    torch.manual_seed(0)
    lin, norm = nn.Linear(8, 8), nn.LayerNorm(8)
    x = torch.randn(4, 8, requires_grad=True)
    y = ENDS[end](x, lin, norm)
    if release:
        release_output(y)
    grad = torch.randn(4, 8, generator=torch.Generator().manual_seed(1))
    torch.autograd.backward(y, grad)
    held = y.untyped_storage().nbytes()
    return [x.grad, *(p.grad for p in [*lin.parameters(), *norm.parameters()])], held


@pytest.mark.parametrize("end", sorted(ENDS))
def test_a_released_output_gives_the_kept_outputs_gradients(end: str) -> None:
    kept, kept_bytes = _grads(end, release=False)
    freed, freed_bytes = _grads(end, release=True)
    for a, b in zip(kept, freed, strict=True):
        if a is None:
            assert b is None
        else:
            assert torch.equal(a, b)
    assert kept_bytes == 4 * 8 * 4
    assert freed_bytes == 4  # one fp32 element, seen at every position


def test_views_and_leaves_keep_their_data() -> None:
    leaf = torch.randn(4, 8, requires_grad=True)
    release_output(leaf)
    assert leaf.untyped_storage().nbytes() == 4 * 8 * 4
    base = torch.randn(4, 8, requires_grad=True) * 2
    view = base[1:]
    release_output(view)
    assert view.untyped_storage().nbytes() == 4 * 8 * 4
