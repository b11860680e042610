"""Compressed data-parallel gradient reduction: bf16 and PowerSGD, on the engine's DP buckets.

Both act on the DP reduction only (TP is untouched), so for a fixed DP degree every TP layout
sends the same compressed gradient of each logical parameter.

bf16      the bucket's fp32 gradient is sent and summed in bfloat16 and copied back into the
          fp32 buffer (micro-batch accumulation and the optimizer stay fp32), as DDP's
          bf16_compress_hook; any ZeRO stage.
powersgd  Vogels et al. 2019, with the semantics of torch's ddp_comm_hooks.powerSGD_hook, for
          stages 0-1: each matrix gradient M (plus this rank's error feedback) is approximated
          as P Q^T of rank r: P = M Q, summed over DP, orthonormalized; Q = M^T P, summed over DP;
          the error M - P Q^T / dp is kept for the next step and Q is reused (warm start).
          Vectors, matrices too small to gain (rows * cols <= 2 * (rows + cols) * r, by the
          logical shape) and sequence-parallel parameters (whose gradients are still partial
          over TP here) go uncompressed in one flat all-reduce, as do all gradients during the
          first `start_step` steps. Under TP a matrix's P or Q is summed over the TP group where
          its sharding splits the product, and P is orthonormalized with CholeskyQR on its Gram
          matrix summed over the sharded rows, so the factors are those of the logical matrix.
          The error feedback and Q are per-rank state that a checkpoint does not keep: a resumed
          run warms up again (start_step uncompressed steps).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch import Tensor

from tpformer.engine.flat_buffer import FlatBucket, Segment
from tpformer.parallel.comm import (
    all_reduce,
    all_reduce_async,
    all_reduce_coalesced,
    reduce_scatter_async,
    wait,
)
from tpformer.parallel.handle import GroupHandle
from tpformer.parallel.init import logical_shape
from tpformer.parallel.param_info import param_info
from tpformer.parallel.random import derive_seed, name_key


class Bf16Reduction:
    """A bucket's DP sum in bfloat16: all-reduce (or reduce-scatter into `out`, this rank's
    chunk of `whole`), copied back into the fp32 buffer by `wait`."""

    def __init__(
        self, whole: Tensor, out: Tensor | None, bucket: FlatBucket, dp: GroupHandle
    ) -> None:
        self.half = whole.to(torch.bfloat16)
        self.whole, self.out = whole, out
        if out is None:
            self.work = all_reduce_async(self.half, dp)
        else:
            self.shard = torch.empty(bucket.shard_size, dtype=torch.bfloat16, device=whole.device)
            self.work = reduce_scatter_async(self.shard, self.half, dp)

    def wait(self) -> None:
        wait(self.work)
        if self.out is None:
            self.whole.copy_(self.half)
        else:
            self.out.copy_(self.shard)


@dataclass
class _Matrix:
    """One compressible gradient, viewed as [rows, cols] (this TP rank's part of them)."""

    seg: Segment
    tp_dim: int | None
    q: Tensor
    error: Tensor | None = None
    p: Tensor = field(default_factory=lambda: torch.empty(0))


class PowerSGD:
    """The stage 0-1 reduction of every bucket under parallel.grad_compression=powersgd (see the
    module docstring). `reduce(i, whole)` replaces bucket i's DP all-reduce: on return `whole`
    holds the (approximate) sum over DP ranks."""

    MIN_COMPRESSION_RATE = 2.0

    def __init__(
        self,
        buckets: list[FlatBucket],
        dp: GroupHandle,
        tp: GroupHandle,
        *,
        rank: int,
        start_step: int,
        seed: int,
        device: torch.device,
    ) -> None:
        self.buckets, self.dp, self.tp = buckets, dp, tp
        self.rank, self.start_step = rank, start_step
        self.calls = [0] * len(buckets)
        self.matrices: list[list[_Matrix]] = []
        self.plain: list[list[Segment]] = []
        for bucket in buckets:
            matrices, plain = [], []
            for seg in bucket.segments:
                shape, info = logical_shape(seg.param), param_info(seg.param)
                rows, cols = shape[0], math.prod(shape[1:]) if len(shape) > 1 else 1
                if (
                    len(shape) < 2
                    or info.sequence_parallel
                    or (info.tp_dim not in (None, 0) and len(shape) != 2)
                    or rows * cols <= self.MIN_COMPRESSION_RATE * (rows + cols) * rank
                ):
                    plain.append(seg)
                    continue
                matrices.append(_Matrix(seg, info.tp_dim, self._initial_q(seg, cols, seed, device)))
            self.matrices.append(matrices)
            self.plain.append(plain)

    def _initial_q(self, seg: Segment, cols: int, seed: int, device: torch.device) -> Tensor:
        """Q [cols, rank] drawn for the logical matrix (the same on every rank and layout);
        this TP rank's rows when the columns are TP-sharded."""
        gen = torch.Generator().manual_seed(derive_seed(seed, name_key(seg.name), 0x9516))
        q = torch.randn(cols, self.rank, generator=gen)
        if param_info(seg.param).tp_dim == 1:  # a [rows, cols / tp] chunk: its rows of Q
            local = seg.shape[1]
            q = q[self.tp.rank * local : (self.tp.rank + 1) * local]
        return q.to(device)

    def reduce(self, i: int, whole: Tensor) -> None:
        """Sum bucket i's gradient buffer over DP, compressed once the warm-up is over."""
        bucket, step = self.buckets[i], self.calls[i]
        self.calls[i] += 1
        if step < self.start_step:
            all_reduce(whole, self.dp)
            return
        all_reduce_coalesced([bucket.view(whole, s) for s in self.plain[i]], self.dp)
        matrices = self.matrices[i]
        if not matrices:
            return
        grads = [bucket.view(whole, m.seg).reshape(m.seg.shape[0], -1) for m in matrices]
        for m, grad in zip(matrices, grads):
            if m.error is None:
                m.error = torch.zeros_like(grad)
            grad.add_(m.error)  # M = gradient + error feedback, in place
        # P = M Q: summed over TP where the columns are split, then over DP
        for m, grad in zip(matrices, grads):
            m.p = grad.matmul(m.q)
        all_reduce_coalesced([m.p for m in matrices if m.tp_dim == 1], self.tp)
        all_reduce_coalesced([m.p for m in matrices], self.dp)
        self._orthonormalize(matrices)
        # Q = M^T P: summed over TP where the rows are split, then over DP
        for m, grad in zip(matrices, grads):
            m.q = grad.t().matmul(m.p)
        all_reduce_coalesced([m.q for m in matrices if m.tp_dim == 0], self.tp)
        all_reduce_coalesced([m.q for m in matrices], self.dp)
        for m, grad in zip(matrices, grads):
            approx = m.p.matmul(m.q.t())  # the sum over DP of the compressed gradients
            torch.sub(grad, approx, alpha=1.0 / self.dp.size, out=m.error)
            grad.copy_(approx)

    def _orthonormalize(self, matrices: list[_Matrix]) -> None:
        """CholeskyQR of each P: its Gram matrix P^T P (summed over TP where P's rows are
        split), regularized, factored, and P <- P L^-T; in float64 for stability."""
        grams = [m.p.double().t().matmul(m.p.double()) for m in matrices]
        all_reduce_coalesced([g for m, g in zip(matrices, grams) if m.tp_dim == 0], self.tp)
        for m, gram in zip(matrices, grams):
            scale = float(gram.diagonal().sum()) / self.rank
            eye = torch.eye(self.rank, dtype=gram.dtype, device=gram.device)
            factor = torch.linalg.cholesky(gram + (1e-10 * scale + 1e-30) * eye)
            solved = torch.linalg.solve_triangular(factor, m.p.double().t(), upper=False)
            m.p = solved.t().to(m.p.dtype).contiguous()
