"""Dropout keyed by the training position (see tpformer.parallel.random for the two modes).

fast mode: one counter-based hash mask per tensor (`keep_mask`), keyed by the global sample and
the element's global position in it, so every layout and micro-batching draws the same masks;
integer tensor ops only, so it runs inside compiled graphs (trainer.compile) and, on GPUs in
eager mode, as one compiled kernel. (The attention probabilities' dropout in fast mode is
drawn by SDPA's fused kernel: layers/attention.py.)

exact mode: a mask is drawn per global sample, from a generator keyed by the module's name and
the sample's global index: one stream per sample covers the sample's whole tensor as the TP=1
model holds it (all heads of the attention probabilities; the whole sequence of a residual
branch). A rank whose tensor is a slice of that (its heads under TP, its chunk of the sequence
under sequence parallelism) draws the sample's whole stream and keeps its slice, so every layout
applies the TP=1 run's masks. One generator per sample (not per head) keeps the cost at a re-
seed per sample (a few microseconds) besides the drawing (about 2 ns per element on one CPU
core).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache

import torch
from torch import Tensor, nn

from tpformer.parallel.comm import SEQUENCE_DIM, sequence_range
from tpformer.parallel.handle import GroupHandle
from tpformer.parallel.random import RNGTracker, eager_island, keep_mask, name_key
from tpformer.parallel.sequence_chunks import context_positions


@cache
def _fused_keep_mask() -> Callable[..., Tensor]:
    """keep_mask as one fused kernel, for eager runs on accelerators (a dozen int64 passes over
    the activation otherwise); integer ops, so its bits equal the eager ops' and a compiled
    block's. Made at the first use (importing dynamo costs seconds); the CPU runs the ops."""
    return torch.compile(keep_mask, dynamic=True)


class _ApplyMask(torch.autograd.Function):
    """x * mask, the mask saved for backward: bool (1 byte/element) times the scale on
    accelerators, whose kernels cast it on the fly; on CPU a float32 mask already holding 0 or
    the scale, since there converting a bool mask costs about 4x the multiply itself (measured,
    [32, 25, 384], 1 thread: 465 -> 164 us forward, 309 -> 123 us backward; same bits)."""

    @staticmethod
    def forward(ctx, x: Tensor, mask: Tensor, scale: float) -> Tensor:
        ctx.save_for_backward(mask)
        ctx.scale = scale
        return _masked(x, mask, scale)

    @staticmethod
    def backward(ctx, grad: Tensor):
        (mask,) = ctx.saved_tensors
        return _masked(grad, mask, ctx.scale), None, None


def dropout_mask_bytes(device_type: str, dtype: torch.dtype) -> int:
    """Bytes per element of the mask dropout saves for backward (the planner's memory model):
    a float32 0-or-scale mask for fp32 on CPU (see _ApplyMask), a bool one elsewhere."""
    return 4 if device_type == "cpu" and dtype == torch.float32 else 1


def _masked(x: Tensor, mask: Tensor, scale: float) -> Tensor:
    if mask.dtype == torch.bool:
        return torch.mul(x, mask).mul_(scale)
    return x * mask  # 0 or the scale already


class ParallelDropout(nn.Module):
    """Dropout keyed by position. Input [b, ...] (per sample); with `heads` (the model's
    number of attention heads) [b, heads/tp, ...], this rank's heads starting at `head_offset`;
    with `sequence` (the TP group of a sequence-parallel region) [b, s/tp, ...], this rank's
    chunk of the sequence.
    With `context` (the CP ring) [b, s/cp, ...] (or [b, s/(cp tp), ...] with `sequence`): this
    CP rank's positions, rows of the whole sequence's stream in exact mode.

    `site` is a stable key of this module, set by `assign_dropout_sites` from its name.
    """

    site_key: Tensor

    def __init__(
        self,
        p: float,
        rng: RNGTracker,
        *,
        heads: int | None = None,
        sequence: GroupHandle | None = None,
        context: GroupHandle | None = None,
    ) -> None:
        super().__init__()
        if not 0.0 <= p < 1.0:
            raise ValueError(f"dropout p={p} must be in [0, 1)")
        self.p, self.rng, self.heads = p, rng, heads
        self.sequence = sequence if sequence is not None and sequence.size > 1 else None
        self.context = context if context is not None and context.size > 1 else None
        self._site: int | None = None
        self.register_buffer("site_key", torch.zeros((), dtype=torch.int64), persistent=False)
        """The site as a tensor: what fast mode's in-graph mask reads (a Python int would be a
        constant of the compiled graph and recompile it per block)."""

    @property
    def site(self) -> int | None:
        return self._site

    @site.setter
    def site(self, key: int) -> None:
        self._site = key
        self.site_key.fill_(key)

    def forward(self, x: Tensor, head_offset: int = 0) -> Tensor:
        if not self.training or self.p == 0.0:
            return x
        # (not read while compiling: a Python int read in a graph is a guard on its value, and
        # every block would recompile)
        if not torch.compiler.is_compiling() and self._site is None:
            raise RuntimeError("ParallelDropout has no site; call assign_dropout_sites(model)")
        if self.rng.fast:
            return self._drop_fast(x, head_offset)
        return self._drop_exact(x, head_offset)

    def _drop_fast(self, x: Tensor, head_offset: int) -> Tensor:
        """The hash mask of this rank's elements at their global positions (traceable)."""
        shape = x.shape if x.dim() > 2 else (x.shape[0], 1, *x.shape[1:])
        positions = self._row_positions(shape[1], head_offset, x.device)
        rng = self.rng
        if x.is_meta:  # a dry run (train/dry_run.py): what the fused kernel allocates
            keep = torch.empty(shape, dtype=torch.bool, device=x.device)
        else:
            on_host = x.device.type == "cpu" or torch.compiler.is_compiling()
            draw = keep_mask if on_host else _fused_keep_mask()
            keep = draw(rng.step_key, rng.first_sample, self.site_key, positions, shape, self.p)
        keep = keep.view(x.shape)
        scale = 1.0 / (1.0 - self.p)
        if dropout_mask_bytes(x.device.type, x.dtype) == 4:
            return _ApplyMask.apply(x, keep.float().mul_(scale), scale)
        return _ApplyMask.apply(x, keep, scale)

    def _row_positions(self, rows: int, head_offset: int, device: torch.device) -> Tensor:
        """Global index along dim 1 of this rank's rows: its heads (offset by `head_offset`),
        its CP positions (and its SP chunk of them), its SP chunk, or all of them."""
        if self.heads is not None:
            return torch.arange(head_offset, head_offset + rows, device=device)
        split = self.sequence.size if self.sequence is not None else 1
        if self.context is not None:
            whole = rows * split * self.context.size
            positions = context_positions(whole, self.context.rank, self.context.size, device)
        else:
            positions = torch.arange(rows * split, device=device)
        if self.sequence is None:
            return positions
        return positions.narrow(0, sequence_range(rows, self.sequence)[0], rows)

    @eager_island
    def _drop_exact(self, x: Tensor, head_offset: int) -> Tensor:
        whole, slices = self._sample_layout(x.shape[1:], head_offset, x.device)
        direct = whole == list(x.shape[1:])
        noise = torch.empty(x.shape, device=x.device, dtype=torch.float32)
        assert self.site is not None  # forward checked it
        for i, gen in enumerate(self.rng.sample_generators(x.device, self.site, x.shape[0])):
            if direct:
                noise[i].uniform_(generator=gen)
                continue
            full = torch.empty(whole, device=x.device, dtype=noise.dtype).uniform_(generator=gen)
            for dim, start, length in slices:
                full = (
                    full.narrow(dim, start, length)
                    if isinstance(start, int)
                    else full.index_select(dim, start)
                )
            noise[i].copy_(full)
        scale = 1.0 / (1.0 - self.p)
        if dropout_mask_bytes(x.device.type, x.dtype) == 4:
            mask = noise.ge_(self.p).mul_(scale)  # in place: 0 or the scale (see _ApplyMask)
        else:
            mask = noise >= self.p
        return _ApplyMask.apply(x, mask, scale)

    def ring_keep(
        self, q: Tensor, head_offset: int, positions: list[Tensor], cp_rank: int
    ) -> tuple[Callable[[int], Tensor | None], tuple[Tensor, ...]]:
        """Ring attention's dropout: src -> the scaled keep mask [b, h/tp, n, n_src] of this
        rank's queries (q: [b, h/tp, n, d]) against CP rank src's keys, or None when no
        dropout applies. exact: each sample's [heads, s, s] stream drawn once per call (as the
        CP=1 model draws it) and this rank's heads and query rows kept (bool); a block is its
        key columns. fast: a stream per (block, TP rank, CP rank), drawn again in backward
        from the key of the forward's position (captured here: under a pipeline schedule other
        micro-batches' forwards move the tracker before this one's backward). Also returned:
        the tensors the function holds until backward (the exact masks), which ring attention
        saves as its own."""
        if not self.training or self.p == 0.0:
            return (lambda src: None), ()
        if self.site is None:
            raise RuntimeError("ParallelDropout has no site; call assign_dropout_sites(model)")
        scale = 1.0 / (1.0 - self.p)
        b, heads, n = q.shape[:3]
        q_pos = positions[cp_rank]
        if self.rng.fast:
            site, rng = self.site, self.rng
            forward_position = rng.state_dict()  # backward runs at another position (pipelines)

            def drawn(src: int) -> Tensor:
                shape = (b, heads, n, positions[src].numel())
                key = name_key(f"{site}/{src}")
                with rng.restored(forward_position), rng.forked(q.device, key):
                    keep = torch.empty(shape, device=q.device).bernoulli_(1.0 - self.p)
                return keep.mul_(scale)

            return drawn, ()
        assert self.heads is not None, "attention dropout is built with heads="
        width = max(n * len(positions), self.rng.mask_width)
        rows = torch.empty((b, heads, n, width), dtype=torch.bool, device=q.device)
        for i, gen in enumerate(self.rng.sample_generators(q.device, self.site, b)):
            full = torch.empty(self.heads, width, width, device=q.device).uniform_(generator=gen)
            rows[i] = full.narrow(0, head_offset, heads).index_select(1, q_pos) >= self.p
        return (lambda src: rows.index_select(-1, positions[src]).float().mul_(scale)), (rows,)

    def _sample_layout(
        self, shape: torch.Size, head_offset: int, device: torch.device
    ) -> tuple[list[int], list[tuple[int, int | Tensor, int]]]:
        """The shape of one sample's whole stream, and the (dim, start, length) slices of it
        that are this rank's `shape`. Attention probabilities [heads, s, s] are drawn at the
        step's mask width (RNGTracker.mask_width): a micro-batch padded narrower than the widest
        of its step then keeps the top-left corner, so (head, query, key) gets the same value
        however the sample's micro-batch was padded (row-major [s, ...] streams, the other
        sites, have that property by themselves)."""
        if self.heads is not None:
            s = shape[-1]
            width = max(s, self.rng.mask_width)
            return [self.heads, width, width], [(0, head_offset, shape[0]), (1, 0, s), (2, 0, s)]
        if self.context is not None:  # this CP rank's positions (then its TP chunk of them)
            dim = SEQUENCE_DIM - 1
            local = shape[dim]
            split = self.sequence.size if self.sequence is not None else 1
            positions = context_positions(
                local * split * self.context.size, self.context.rank, self.context.size, device
            )
            if self.sequence is not None:
                positions = positions.narrow(0, sequence_range(local, self.sequence)[0], local)
            whole = list(shape)
            whole[dim] = local * split * self.context.size
            return whole, [(dim, positions, local)]
        if self.sequence is not None:
            dim = SEQUENCE_DIM - 1  # the sample's own dims: [s/tp, ...]
            local = shape[dim]
            whole = list(shape)
            whole[dim] = local * self.sequence.size
            return whole, [(dim, sequence_range(local, self.sequence)[0], local)]
        return list(shape), []

    def extra_repr(self) -> str:
        heads = f", heads={self.heads}" if self.heads is not None else ""
        sequence = f", sequence_parallel={self.sequence.size}" if self.sequence else ""
        context = f", context_parallel={self.context.size}" if self.context else ""
        return f"p={self.p}{heads}{sequence}{context}"


def assign_dropout_sites(model: nn.Module) -> None:
    """Key every ParallelDropout by its module name, which is the same in every layout."""
    for name, module in model.named_modules():
        if isinstance(module, ParallelDropout):
            module.site = name_key(name)
