"""Column- and row-parallel linear layers (Megatron's f/g pair).

With `sequence_parallel=True` (Megatron-SP) the pair's outer activations are sequence-sharded
[b, s/tp, h]: the column layer all-gathers its input along the sequence (backward:
reduce-scatter) and the row layer reduce-scatters its output (backward: all-gather) instead of
the all-reduces; the bytes are the same, the activations between hold 1/tp of the sequence.
The column layer keeps only its input chunk for backward and gathers it again there
(Korthikanti et al. 2022, 4.2.2), overlapped with the input-gradient matmul.

parallel.precision=fp8 (layers/fp8.py): the engine gives the linears of the blocks an
`Fp8Scaling`, and their matmuls (with the shared gather of the SP path) run in fp8.

NOTE: parameters start at zero; a model initializes them with `initialize_parameters` (layout
independent) or `load_full_state_dict`.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tpformer.layers.base import TPModule
from tpformer.layers.fp8 import (
    cast_input,
    fp8_linear,
    fp8_linears,
    linears_backward,
    matmuls_forward,
)
from tpformer.parallel.comm import (
    SequenceGather,
    SequenceReduceScatter,
    copy_to_tp,
    gather_from_tp,
    reduce_from_tp,
    reduce_scatter_sequence,
    scatter_to_tp,
)
from tpformer.parallel.fp8_scaling import Fp8Scaling
from tpformer.parallel.handle import GroupHandle
from tpformer.parallel.init import mark_sequence_parallel, mark_sharded
from tpformer.parallel.layout import divide


class _SequenceGatheredLinear(torch.autograd.Function):
    """y_i = all_gather_seq(x) @ W_i.T + b_i for each weight, saving x's sequence chunk rather
    than the gathered input: backward re-gathers it for the weight gradients (while the input
    gradient is computed) and reduce-scatters the input gradient (while the weight gradients
    are). Several weights (grouped-query attention's query and key/value) share one gather.
    With an Fp8Scaling the chunk is cast to fp8 first (scaled by the whole sequence's amax,
    reduced over TP) and gathered, kept and re-gathered as fp8: half of bf16's bytes on the
    wire and in memory, as Transformer Engine's fp8 all-gather; the matmuls run in fp8."""

    @staticmethod
    def forward(
        ctx, x: Tensor, tp: GroupHandle, fp8: Fp8Scaling | None, *params: Tensor | None
    ) -> tuple[Tensor, ...]:
        weights = [w for w in params[0::2] if w is not None]
        biases = params[1::2]
        ctx.tp, ctx.fp8, ctx.has_bias = tp, fp8, [b is not None for b in biases]
        if fp8 is not None:
            xq, scales = cast_input(x.reshape(-1, x.shape[-1]), weights, fp8)
            ctx.save_for_backward(xq, scales, *weights)  # this rank's chunk, 1 byte an element
            ctx.x_shape = x.shape
            whole = _gathered_fp8(xq.view(x.shape), tp)
            outs = matmuls_forward(whole.flatten(0, 1), scales, weights, biases, x.dtype)
            return tuple(y.view(*whole.shape[:-1], y.shape[-1]) for y in outs)
        whole = SequenceGather(x, tp).result()
        ctx.save_for_backward(x, *weights)
        return tuple(F.linear(whole, w, b) for w, b in zip(weights, biases, strict=True))

    @staticmethod
    def backward(ctx, *grads: Tensor):
        if ctx.fp8 is not None:
            return _SequenceGatheredLinear._fp8_backward(ctx, *grads)
        x, *weights = ctx.saved_tensors
        gather = SequenceGather(x, ctx.tp)
        grad_input = grads[0].matmul(weights[0])
        for grad, weight in zip(grads[1:], weights[1:], strict=True):
            grad_input = grad_input + grad.matmul(weight)
        scatter = SequenceReduceScatter(grad_input, ctx.tp)
        whole = gather.result().reshape(-1, x.shape[-1])
        params: list[Tensor | None] = []
        for grad, has_bias in zip(grads, ctx.has_bias, strict=True):
            grad_2d = grad.reshape(-1, grad.shape[-1])
            params += [grad_2d.t().matmul(whole), grad_2d.sum(0) if has_bias else None]
        return scatter.result(), None, None, *params

    @staticmethod
    def _fp8_backward(ctx, *grads: Tensor):
        xq, scales, *weights = ctx.saved_tensors
        b, _, width = ctx.x_shape
        whole = _gathered_fp8(xq.view(ctx.x_shape), ctx.tp).flatten(0, 1)
        grad_input, params = linears_backward(grads, whole, scales, weights, ctx.has_bias, ctx.fp8)
        scatter = SequenceReduceScatter(grad_input.view(b, -1, width), ctx.tp)
        return scatter.result(), None, None, *params


def _gathered_fp8(chunk: Tensor, tp: GroupHandle) -> Tensor:
    """The whole sequence [b, s, in] of fp8 chunks [b, s/tp, in], gathered as bytes."""
    return SequenceGather(chunk.view(torch.uint8), tp).result().view(chunk.dtype)


def linear(x: Tensor, weight: Tensor, bias: Tensor | None, fp8: Fp8Scaling | None) -> Tensor:
    """F.linear, in fp8 when the layer has an Fp8Scaling."""
    return F.linear(x, weight, bias) if fp8 is None else fp8_linear(x, weight, bias, fp8)


def linears(
    x: Tensor, pairs: list[tuple[Tensor, Tensor | None]], fp8: Fp8Scaling | None
) -> tuple[Tensor, ...]:
    """F.linear of x with each (weight, bias) of `pairs`; in fp8 (one cast of x) with a scaling."""
    if fp8 is None:
        return tuple(F.linear(x, w, b) for w, b in pairs)
    return fp8_linears(x, pairs, fp8)


def sequence_gathered_linears(
    x: Tensor,
    pairs: list[tuple[Tensor, Tensor | None]],
    tp: GroupHandle,
    fp8: Fp8Scaling | None = None,
) -> tuple[Tensor, ...]:
    """F.linear of the whole sequence from this rank's chunk x [b, s/tp, in] with each
    (weight, bias) of `pairs`, after one gather -> one [b, s, out_i] each."""
    if tp.size == 1:
        return linears(x, pairs, fp8)
    return _SequenceGatheredLinear.apply(x, tp, fp8, *(t for pair in pairs for t in pair))


def sequence_gathered_linear(
    x: Tensor, weight: Tensor, bias: Tensor | None, tp: GroupHandle
) -> Tensor:
    """F.linear of the whole sequence from this rank's chunk x [b, s/tp, in] -> [b, s, out]."""
    return sequence_gathered_linears(x, [(weight, bias)], tp)[0]


class ColumnParallelLinear(TPModule):
    """y = x @ W.T + b with W split along out_features across the TP group.

    Input is replicated; output is sharded on its last dim unless gather_output=True.
    Backward all-reduces the input gradient (copy_to_tp), forward issues no collective.
    sequence_parallel: input [b, s/tp, in], all-gathered along the sequence first.
    """

    fp8: Fp8Scaling | None = None
    """Set by the engine on the blocks' linears under parallel.precision=fp8."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        tp: GroupHandle,
        *,
        bias: bool = True,
        gather_output: bool = False,
        sequence_parallel: bool = False,
        device: torch.device | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self.tp, self.gather_output, self.sequence_parallel = tp, gather_output, sequence_parallel
        self.in_features, self.out_features = in_features, out_features
        self.out_per_rank = divide(out_features, tp.size, what="out_features")
        kw: dict[str, Any] = {"device": device, "dtype": dtype}
        self.weight = mark_sharded(
            nn.Parameter(torch.zeros(self.out_per_rank, in_features, **kw)), 0, out_features
        )
        self.bias = (
            mark_sharded(nn.Parameter(torch.zeros(self.out_per_rank, **kw)), 0, out_features)
            if bias
            else None
        )

    def forward(self, x: Tensor) -> Tensor:  # x: [..., in]
        if self.sequence_parallel:
            pair: list[tuple[Tensor, Tensor | None]] = [(self.weight, self.bias)]
            (y,) = sequence_gathered_linears(x, pair, self.tp, self.fp8)  # [b, s, out/tp]
        else:
            y = linear(copy_to_tp(x, self.tp), self.weight, self.bias, self.fp8)  # [..., out/tp]
        return gather_from_tp(y, self.tp) if self.gather_output else y

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}, tp={self.tp.size}"


class RowParallelLinear(TPModule):
    """y = x @ W.T + b with W split along in_features across the TP group.

    Input is sharded on its last dim unless input_is_parallel=False; output is replicated.
    The bias is replicated and added once, after the single forward all-reduce.
    sequence_parallel: output [b, s/tp, out] by a reduce-scatter along the sequence; the bias
    then sees this rank's chunk only, so its gradient is summed over TP by the engine.
    """

    fp8: Fp8Scaling | None = None
    """Set by the engine on the blocks' linears under parallel.precision=fp8."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        tp: GroupHandle,
        *,
        bias: bool = True,
        input_is_parallel: bool = True,
        sequence_parallel: bool = False,
        device: torch.device | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self.tp, self.input_is_parallel = tp, input_is_parallel
        self.sequence_parallel = sequence_parallel
        self.in_features, self.out_features = in_features, out_features
        self.in_per_rank = divide(in_features, tp.size, what="in_features")
        kw: dict[str, Any] = {"device": device, "dtype": dtype}
        self.weight = mark_sharded(
            nn.Parameter(torch.zeros(out_features, self.in_per_rank, **kw)), 1, in_features
        )
        self.bias = nn.Parameter(torch.zeros(out_features, **kw)) if bias else None
        if sequence_parallel and self.bias is not None:
            mark_sequence_parallel(self.bias)

    def forward(self, x: Tensor) -> Tensor:  # x: [..., in/tp] (or [..., in] if not parallel)
        if not self.input_is_parallel:
            x = scatter_to_tp(x, self.tp)
        y = linear(x, self.weight, None, self.fp8)  # partial sums: one reduction over TP
        y = (
            reduce_scatter_sequence(y, self.tp)
            if self.sequence_parallel
            else reduce_from_tp(y, self.tp)
        )
        return y if self.bias is None else y + self.bias

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}, tp={self.tp.size}"
