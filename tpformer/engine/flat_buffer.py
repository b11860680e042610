"""FlatBucket: parameters of one unit laid out back to back, padded to a multiple of dp.

Every collective of the engine runs on these flat buffers (one call per bucket, never per
tensor), and each DP rank owns the contiguous chunk [shard_start, shard_start + shard_size).
Padding makes any parameter shape partitionable.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from tpformer.parallel.layout import pad_to_multiple
from tpformer.parallel.param_info import param_info


@dataclass
class Segment:
    """Where one parameter lives in its bucket's flat buffer."""

    name: str
    param: nn.Parameter
    offset: int
    numel: int
    shape: torch.Size
    decay: bool
    """Weight decay applies (matrices and embeddings; not biases or LayerNorms)."""
    tp_sharded: bool
    """Different on every TP rank; replicated ones are counted once in the global norm."""


class FlatBucket:
    """One unit's parameters (a transformer layer, or everything else) in a flat layout."""

    def __init__(
        self,
        named_params: list[tuple[str, nn.Parameter]],
        dp_size: int,
        dp_rank: int,
        *,
        module: nn.Module | None = None,
    ) -> None:
        self.module = module
        self.segments: list[Segment] = []
        offset = 0
        # Decayed parameters first: the optimizer then sees at most two contiguous pieces of a
        # shard, one per weight-decay group, and decays inside its fused kernel.
        for name, p in sorted(named_params, key=lambda np: np[1].dim() < 2):
            self.segments.append(
                Segment(
                    name,
                    p,
                    offset,
                    p.numel(),
                    p.shape,
                    p.dim() >= 2,
                    tp_sharded=param_info(p).tp_dim is not None,
                )
            )
            offset += p.numel()
        self.numel = offset
        self.decay_numel = sum(seg.numel for seg in self.segments if seg.decay)
        self.padded_numel = pad_to_multiple(max(offset, 1), dp_size)
        self.shard_size = self.padded_numel // dp_size
        self.shard_start = dp_rank * self.shard_size

    @torch.no_grad()
    def flatten(self, dtype: torch.dtype, device: torch.device) -> Tensor:
        """A new padded flat buffer holding the parameters' current values."""
        flat = torch.zeros(self.padded_numel, dtype=dtype, device=device)
        for seg in self.segments:
            self.view(flat, seg).copy_(seg.param.detach())
        return flat

    def shard_of(self, flat: Tensor) -> Tensor:
        """This DP rank's chunk of a full flat buffer (a view)."""
        return flat.narrow(0, self.shard_start, self.shard_size)

    def view(self, flat: Tensor, segment: Segment) -> Tensor:
        return flat.narrow(0, segment.offset, segment.numel).view(segment.shape)

    def decay_split(self, *, whole: bool) -> tuple[tuple[int, int], tuple[int, int]]:
        """[start, stop) of the decayed and the non-decayed part of the whole buffer
        (whole=True) or of this rank's shard, in that tensor's own coordinates."""
        size = self.padded_numel if whole else self.shard_size
        boundary = self.decay_numel - (0 if whole else self.shard_start)
        boundary = min(max(boundary, 0), size)
        return (0, boundary), (boundary, size)

    def shard_ranges(self) -> list[tuple[Segment, int, int]]:
        """(segment, start, stop) of each segment's part inside this rank's shard, shard-local."""
        lo, hi = self.shard_start, self.shard_start + self.shard_size
        ranges = []
        for seg in self.segments:
            a, b = max(lo, seg.offset), min(hi, seg.offset + seg.numel)
            if a < b:
                ranges.append((seg, a - lo, b - lo))
        return ranges


class BufferPool:
    """Reuses the transient full-size gradient accumulators of ZeRO 2-3 instead of returning
    them to the allocator.

    The pool never holds more than the most buffers in use at once, which the peak already
    paid for; reuse avoids faulting in fresh pages for every bucket (tens of MB per layer). A
    request that no free buffer of its size meets takes the front of a free one at most 1/64
    larger: a pre-norm encoder's first layer lacks a norm, and its buckets would otherwise
    make a second set of buffers. (Not a larger margin: a shard or a layer taking the root's
    buffer leaves the root to make a new one.)
    """

    def __init__(self) -> None:
        self._free: dict[tuple[int, torch.dtype, torch.device], list[Tensor]] = {}
        self.made_bytes = 0
        """Bytes of every buffer it made (in use or waiting): they are never freed."""

    def take(self, numel: int, dtype: torch.dtype, device: torch.device, *, zero: bool) -> Tensor:
        key = (numel, dtype, device)
        if not self._free.get(key):
            most = numel + numel // 64
            near = [k for k, v in self._free.items() if v and k[1:] == key[1:]]
            key = min((k for k in near if numel < k[0] <= most), default=key)
        stack = self._free.get(key)
        if stack:
            buf = stack.pop()[:numel]
        else:
            buf = torch.empty(numel, dtype=dtype, device=device)
            self.made_bytes += buf.nbytes
        return buf.zero_() if zero else buf

    def give(self, buf: Tensor | None) -> None:
        if buf is not None:
            whole = buf if buf._base is None else buf._base  # the front of a larger one
            self._free.setdefault((whole.numel(), whole.dtype, whole.device), []).append(whole)
