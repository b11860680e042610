"""Dropout whose mask depends on global positions only (see tpformer.parallel.random).

A mask is drawn per global sample (replicated regions: embeddings, residual branches) or per
(global sample, global head) (attention probabilities, sharded by heads), from a generator keyed
by the module's name. Ranks draw only their own slices and agree with the TP=1 model. In a
sequence-sharded region (sequence parallelism) a sample's mask is still drawn for the whole
sequence, from the same generator, and a rank keeps its chunk of positions: the mask is keyed by
global token position, exactly the TP=1 run's.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from tpformer.parallel.comm import SEQUENCE_DIM, sequence_range
from tpformer.parallel.context import GroupHandle
from tpformer.parallel.random import RNGTracker, name_key


class _ApplyMask(torch.autograd.Function):
    """x * mask * scale, keeping the mask as bool (1 byte/element) for backward."""

    @staticmethod
    def forward(ctx, x: Tensor, keep: Tensor, scale: float) -> Tensor:  # type: ignore[override]
        ctx.save_for_backward(keep)
        ctx.scale = scale
        return x * keep * scale

    @staticmethod
    def backward(ctx, grad: Tensor):  # type: ignore[override]
        (keep,) = ctx.saved_tensors
        return grad * keep * ctx.scale, None, None


class ParallelDropout(nn.Module):
    """Layout-independent dropout. Input [b, ...] (per sample) or [b, heads, ...] (per_head);
    with `sequence` (the TP group of a sequence-parallel region) input [b, s/tp, ...], this
    rank's chunk of the sequence.

    `site` is a stable key of this module, set by `assign_dropout_sites` from its name.
    """

    def __init__(self, p: float, rng: RNGTracker, *, per_head: bool = False,
                 sequence: GroupHandle | None = None) -> None:
        super().__init__()
        if not 0.0 <= p < 1.0:
            raise ValueError(f"dropout p={p} must be in [0, 1)")
        self.p, self.rng, self.per_head = p, rng, per_head
        self.sequence = sequence if sequence is not None and sequence.size > 1 else None
        self.site: int | None = None

    def forward(self, x: Tensor, head_offset: int = 0) -> Tensor:
        if not self.training or self.p == 0.0:
            return x
        if self.site is None:
            raise RuntimeError("ParallelDropout has no site; call assign_dropout_sites(model)")
        noise = torch.empty(x.shape, device=x.device, dtype=torch.float32)
        first = self.rng.sample_offset
        for i in range(x.shape[0]):
            if self.per_head:
                for h in range(x.shape[1]):
                    gen = self.rng.generator(x.device, self.site, first + i, head_offset + h)
                    noise[i, h].uniform_(generator=gen)
            else:
                self._draw_sample(noise[i], self.rng.generator(x.device, self.site, first + i))
        return _ApplyMask.apply(x, noise >= self.p, 1.0 / (1.0 - self.p))

    def _draw_sample(self, noise: Tensor, gen: torch.Generator) -> None:
        """One sample's noise; in a sequence-sharded region this rank's chunk of the noise of
        the whole sequence."""
        if self.sequence is None:
            noise.uniform_(generator=gen)
            return
        dim = SEQUENCE_DIM - 1  # the sample's own dims: [s/tp, ...]
        local = noise.shape[dim]
        whole = list(noise.shape)
        whole[dim] = local * self.sequence.size
        start, _ = sequence_range(local, self.sequence)
        full = torch.empty(whole, device=noise.device, dtype=noise.dtype).uniform_(generator=gen)
        noise.copy_(full.narrow(dim, start, local))

    def extra_repr(self) -> str:
        sequence = f", sequence_parallel={self.sequence.size}" if self.sequence else ""
        return f"p={self.p}, per_head={self.per_head}{sequence}"


def assign_dropout_sites(model: nn.Module) -> None:
    """Key every ParallelDropout by its module name, which is the same in every layout."""
    for name, module in model.named_modules():
        if isinstance(module, ParallelDropout):
            module.site = name_key(name)
