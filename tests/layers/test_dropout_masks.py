"""Every dropout site's backward applies its forward's mask, in both RNG modes, at TP=1 and
under TP=2 with sequence parallelism, with and without recomputation -- checked directly: at
each ParallelDropout call the gradient reaching its input is the gradient of its output times
the mask the forward drew (which the output shows wherever the input is not exactly 0: zero
where dropped, the input times 1/(1-p) where kept), and a recomputed forward draws that same
mask again.

The negative control gives backward a mask shifted by one element (the mistake a statistical
test of the loss curve cannot see: tests/train/test_fast_statistics.py moved 0.49 standard
errors under it) and the same check names every site. The attention probabilities' dropout in
fast mode is inside SDPA's kernel (its backward is PyTorch's; tests/engine/test_recompute.py
holds its recomputation bitwise)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from contextlib import nullcontext
from typing import Any

import pytest
import torch

import tpformer.layers.dropout as dropout_module
from tests.dist import run_distributed
from tests.models.common import bert_batch, tiny_bert
from tpformer.config.schema import ParallelConfig
from tpformer.engine.recompute import apply_recompute
from tpformer.layers.dropout import ParallelDropout
from tpformer.models import build_model
from tpformer.parallel.context import ParallelContext
from tpformer.parallel.random import RNGTracker

P = 0.2
RECOMPUTE = ("none", "selective", "full")


class _Recorder:
    """Forward masks, recomputed masks and the gradients around every ParallelDropout call."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.masks: dict[str, list[torch.Tensor]] = defaultdict(list)
        self.grads_in: dict[str, list[torch.Tensor]] = defaultdict(list)
        self.grads_out: dict[str, list[torch.Tensor]] = defaultdict(list)
        self.seen: dict[str, list[torch.Tensor]] = defaultdict(list)
        """Where the mask shows in the output: an input of exactly 0 (the attention
        probability of a padded key) hides it."""
        for name, module in model.named_modules():
            if isinstance(module, ParallelDropout):
                module.register_forward_hook(self._hook(name))

    def _hook(self, name: str) -> Callable[..., None]:
        def hook(module: ParallelDropout, inputs: tuple, output: torch.Tensor) -> None:
            x = inputs[0]
            if not module.training or not x.requires_grad or output is x:
                return
            self.masks[name].append(output != 0)
            self.seen[name].append(x.detach() != 0)
            if not torch.is_grad_enabled() or len(self.masks[name]) > 1:
                return  # a recomputed forward: its tensors are not on the backward's path
            x.register_hook(lambda g: self.grads_in[name].append(g))
            output.register_hook(lambda g: self.grads_out[name].append(g))

        return hook

    def mismatches(self) -> list[str]:
        """Sites whose backward did not apply the forward's mask, or whose recomputed forward
        drew another one; empty when every site is right."""
        wrong = []
        for name, masks in self.masks.items():
            first, seen = masks[0], self.seen[name][0]
            assert seen.float().mean() > 0.5, f"{name}: the mask shows at too few elements"
            if any(not torch.equal(again[seen], first[seen]) for again in masks[1:]):
                wrong.append(f"{name}: recomputed mask differs")
            (grad_in,), (grad_out,) = self.grads_in[name], self.grads_out[name]
            want = torch.where(first, grad_out / (1.0 - P), torch.zeros_like(grad_out))
            if not torch.allclose(grad_in[seen], want[seen], rtol=1e-6, atol=0.0):
                wrong.append(f"{name}: backward mask differs")
        return wrong


def _check(ctx: ParallelContext, recompute: str) -> tuple[list[str], list[str]]:
    """(the sites that dropped, what was wrong) in one forward and backward of tiny BERT."""
    model = build_model(tiny_bert(dropout=P), ctx, task="pretraining")
    apply_recompute(model, ParallelConfig(recompute=recompute), ctx.rng)
    recorder = _Recorder(model)
    ctx.rng.set_position(step=3, sample_offset=0)
    loss = model(**bert_batch()).loss
    ctx.rng.set_position(step=99, sample_offset=50)  # what a recomputation must not draw at
    loss.backward()
    if recompute == "full":  # every layer's sites drawn twice (the blocks are recomputed)
        twice = sorted(name for name, masks in recorder.masks.items() if len(masks) == 2)
        assert twice == sorted(n for n in recorder.masks if ".layers." in n), twice
    return sorted(recorder.masks), recorder.mismatches()


def _every_mode(ctx: ParallelContext) -> dict[str, tuple[list[str], list[str]]]:
    return {recompute: _check(ctx, recompute) for recompute in RECOMPUTE}


def _sites(rng: str) -> int:
    """The embeddings', and per layer the attention output's and the MLP output's (and the
    attention probabilities' in exact mode; fast mode drops them inside SDPA)."""
    return 1 + tiny_bert().num_layers * (3 if rng == "exact" else 2)


@pytest.mark.parametrize("rng", ["exact", "fast"])
def test_each_site_applies_its_forward_mask_in_backward(rng: str) -> None:
    results = _every_mode(ParallelContext.single(device="cpu", rng=rng))
    for recompute, (sites, wrong) in results.items():
        assert len(sites) == _sites(rng), (recompute, sites)
        assert wrong == [], (recompute, wrong)


@pytest.mark.slow  # 2 ranks
def test_each_site_applies_its_forward_mask_under_tp2_sequence_parallel() -> None:
    for rank, results in enumerate(
        run_distributed(_every_mode, 2, tensor=2, sequence_parallel=True, rng="fast")
    ):
        for recompute, (sites, wrong) in results.items():
            assert len(sites) == _sites("fast") and wrong == [], (rank, recompute, wrong)


def _shifted(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
    """_ApplyMask's backward given the forward's mask moved by one element (a wrong offset)."""
    (mask,) = ctx.saved_tensors
    return dropout_module._masked(grad, mask.roll(1, dims=-1), ctx.scale), None, None


@pytest.mark.parametrize("rng", ["exact", "fast"])
def test_the_check_names_every_site_when_backward_shifts_the_mask(
    rng: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(dropout_module._ApplyMask, "backward", staticmethod(_shifted))
    sites, wrong = _check(ParallelContext.single(device="cpu", rng=rng), "none")
    assert len(sites) == _sites(rng)
    assert len(wrong) == len(sites) and all("backward mask differs" in w for w in wrong), wrong


@pytest.mark.parametrize("rng", ["exact", "fast"])
def test_the_check_names_every_recomputed_site_when_recomputation_draws_elsewhere(
    rng: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Recomputation that forgets to replay its forward's RNG position draws the masks of
    the position the run has moved to."""
    monkeypatch.setattr(RNGTracker, "restored", lambda self, state: nullcontext())
    sites, wrong = _check(ParallelContext.single(device="cpu", rng=rng), "full")
    named = {w.split(": ")[0] for w in wrong if w.endswith("recomputed mask differs")}
    assert sorted(named) == [s for s in sites if ".layers." in s], wrong  # all but embeddings'
    assert all(".layers." in w for w in wrong), wrong  # (their backward then differs too)
