"""The scales of fp8 matmuls over sharded operands: each operand's amax reduced over the groups
that shard it, so every layout scales as one process would (layers/fp8.py casts with them; the
engine gives them to the blocks' linears under parallel.precision=fp8)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor

from tpformer.parallel.comm import all_reduce
from tpformer.parallel.handle import GroupHandle

_TINY = 1e-12
"""The smallest amax a scale is computed from (an all-zero operand scales by 448 / 1e-12)."""


@dataclass(frozen=True)
class Fp8Scaling:
    """How a linear layer's fp8 matmuls scale: the groups its operands' amaxes are reduced
    over (TP, and CP where sequences are split; size-1 groups are skipped)."""

    groups: tuple[GroupHandle, ...] = ()

    def scales(self, dtype: torch.dtype, *operands: Tensor) -> Tensor:
        """[len(operands)] fp32: the factor that maps each operand's whole-tensor amax (over
        the groups) to `dtype`'s largest value."""
        amax = torch.stack([t.detach().abs().amax().float() for t in operands])
        for group in self.groups:
            if group.size > 1:
                amax = all_reduce(amax, group, dist.ReduceOp.MAX)
        return torch.finfo(dtype).max / amax.clamp(min=_TINY)
