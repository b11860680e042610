"""FP8 matmuls of the blocks' linear layers (parallel.precision=fp8), through torch._scaled_mm.

Tensor-wise current scaling, as torchao's float8 and Transformer Engine's "current" recipe: each
step every matmul operand is scaled by FP8_MAX / amax(operand) of this step, cast to fp8, and
multiplied with the inverse scales applied in the kernel. Activations and weights are e4m3
(more mantissa), output gradients e5m2 (more range): the forward and both backward matmuls run
in fp8 with bf16 (or the weight's dtype) output. Only the operands are fp8: the layer's input and
output, its weight, bias and gradients stay in the compute dtype (bf16).

Layout independence: an operand sharded over a group (a column-parallel weight over TP, a
row-parallel input over TP, every activation over CP) has its amax all-reduced (MAX) over the
groups (parallel/fp8_scaling.py), so every rank scales by the amax of the whole tensor, as one
process would; TP=2 then quantizes exactly as TP=1 and differs only by the order of its sums.
Reducing a replicated operand's amax is a no-op, so every operand is reduced alike: one
all-reduce of two scalars per layer in forward, one of one in backward (no host sync).

Kernel layout (cuBLASLt on sm89/sm90): the first operand row-major, the second column-major
(`scaled_mm` takes both row-major and transposes the second, a view), e5m2 only as the first,
every dimension a multiple of 16: the model's widths are checked by config/rules/model.py, the
token count of a batch (any, in fine-tuning) is padded here with zero rows, which change no
amax and no product. The CPU kernel takes the same calls.
"""

from __future__ import annotations

import torch
from torch import Tensor

from tpformer.parallel.fp8_scaling import Fp8Scaling

FORWARD_DTYPE = torch.float8_e4m3fn
"""Activations and weights: 3 mantissa bits, max 448."""
BACKWARD_DTYPE = torch.float8_e5m2
"""Output gradients: 2 mantissa bits, max 57,344 (gradients span more range)."""
KERNEL_MULTIPLE = 16
"""Every dimension of a _scaled_mm operand is a multiple of this on GPUs."""


def rows_padded(t: Tensor) -> Tensor:
    """t [m, k] with zero rows appended up to a multiple of KERNEL_MULTIPLE (t itself when m is
    one already); fp8 through its bytes (a zero byte is +0)."""
    short = -t.shape[0] % KERNEL_MULTIPLE
    if short == 0:
        return t
    raw = t.view(torch.uint8) if t.dtype in (FORWARD_DTYPE, BACKWARD_DTYPE) else t
    return torch.cat([raw, raw.new_zeros(short, raw.shape[1])]).view(t.dtype)


def to_fp8(t: Tensor, scale: Tensor, dtype: torch.dtype) -> Tensor:
    """t times `scale`, saturated to `dtype`'s range and cast."""
    limit = torch.finfo(dtype).max
    return (t.float() * scale).clamp(-limit, limit).to(dtype)


def scaled_mm(a: Tensor, a_scale: Tensor, b: Tensor, b_scale: Tensor, out: torch.dtype) -> Tensor:
    """(a / a_scale) @ (b / b_scale).T for fp8 a [m, k] and b [n, k] (row-major both), in `out`."""
    return torch._scaled_mm(
        a, b.t(), scale_a=a_scale.reciprocal(), scale_b=b_scale.reciprocal(), out_dtype=out
    )


def fp8_grads(
    grad: Tensor,
    xq: Tensor,
    x_scale: Tensor,
    wq: Tensor,
    w_scale: Tensor,
    g_scale: Tensor,
    w_dtype: torch.dtype,
) -> tuple[Tensor, Tensor]:
    """(grad @ W, grad.T @ x) of a linear layer, both in fp8: grad [m, out] in the compute dtype
    (cast here to e5m2 with `g_scale`), xq [m', in] (rows padded to m') and wq [out, in] as the
    forward cast them."""
    rows = grad.shape[0]
    gq = to_fp8(rows_padded(grad), g_scale, BACKWARD_DTYPE)
    grad_x = scaled_mm(gq, g_scale, wq.t().contiguous(), w_scale, grad.dtype)[:rows]
    grad_w = scaled_mm(gq.t().contiguous(), g_scale, xq.t().contiguous(), x_scale, w_dtype)
    return grad_x, grad_w


class _Fp8Linears(torch.autograd.Function):
    """y_i = x @ W_i.T + b_i for each weight, all three matmuls of each in fp8, the weights
    sharing one cast of x (grouped-query attention's query and key/value). Keeps that fp8
    input (1 byte an element) instead of the compute-dtype one, and the weights themselves
    (parameters, held anyway), cast again in backward with the forward's scales (as torchao's
    float8 linear does)."""

    @staticmethod
    def forward(ctx, x: Tensor, scaling: Fp8Scaling, *params: Tensor | None) -> tuple[Tensor, ...]:
        weights = [w for w in params[0::2] if w is not None]
        biases = params[1::2]
        xq, scales = cast_input(x.reshape(-1, x.shape[-1]), weights, scaling)
        outs = matmuls_forward(xq, scales, weights, biases, x.dtype)
        ctx.save_for_backward(xq, scales, *weights)
        ctx.scaling, ctx.x_shape = scaling, x.shape
        ctx.has_bias = [b is not None for b in biases]
        return tuple(y.view(*x.shape[:-1], y.shape[-1]) for y in outs)

    @staticmethod
    def backward(ctx, *grads: Tensor):
        xq, scales, *weights = ctx.saved_tensors
        grad_input, params = linears_backward(grads, xq, scales, weights, ctx.has_bias, ctx.scaling)
        return grad_input.view(ctx.x_shape), None, *params


def cast_input(x: Tensor, weights: list[Tensor], scaling: Fp8Scaling) -> tuple[Tensor, Tensor]:
    """(x [m, in] cast to fp8, the scales: x's, then each weight's), the amaxes reduced over
    the scaling's groups (so a sequence chunk of x is scaled as the whole sequence)."""
    scales = scaling.scales(FORWARD_DTYPE, x, *weights)
    return to_fp8(x, scales[0], FORWARD_DTYPE), scales


def matmuls_forward(
    xq: Tensor,
    scales: Tensor,
    weights: list[Tensor],
    biases: tuple[Tensor | None, ...],
    out: torch.dtype,
) -> list[Tensor]:
    """Each xq @ W_i.T + b_i [m, out_i] for the fp8 input xq [m, in], in `out`."""
    rows, padded = xq.shape[0], rows_padded(xq)
    outs = []
    for w, b, w_scale in zip(weights, biases, scales[1:], strict=True):
        y = scaled_mm(padded, scales[0], to_fp8(w, w_scale, FORWARD_DTYPE), w_scale, out)[:rows]
        outs.append(y if b is None else y + b)
    return outs


def linears_backward(
    grads: tuple[Tensor, ...],
    xq: Tensor,
    scales: Tensor,
    weights: list[Tensor],
    has_bias: list[bool],
    scaling: Fp8Scaling,
) -> tuple[Tensor, list[Tensor | None]]:
    """The input gradient [m, in] (summed over the weights) and each weight's and bias's
    gradient of linears that shared the fp8 input xq [m, in], from their output gradients;
    `scales` the forward's (the input's, then each weight's)."""
    xq = rows_padded(xq)
    grads_2d = [g.reshape(-1, g.shape[-1]) for g in grads]
    g_scales = scaling.scales(BACKWARD_DTYPE, *grads_2d)
    grad_input: Tensor | None = None
    params: list[Tensor | None] = []
    for grad, g_scale, w, w_scale, bias in zip(
        grads_2d, g_scales, weights, scales[1:], has_bias, strict=True
    ):
        wq = to_fp8(w, w_scale, FORWARD_DTYPE)
        grad_x, grad_w = fp8_grads(grad, xq, scales[0], wq, w_scale, g_scale, w.dtype)
        grad_input = grad_x if grad_input is None else grad_input + grad_x
        params += [grad_w, grad.sum(0) if bias else None]
    assert grad_input is not None
    return grad_input, params


def fp8_linears(
    x: Tensor, pairs: list[tuple[Tensor, Tensor | None]], scaling: Fp8Scaling
) -> tuple[Tensor, ...]:
    """F.linear(x, weight, bias) for each (weight, bias) of `pairs`, forward and backward
    matmuls in fp8, one cast of x shared."""
    return _Fp8Linears.apply(x, scaling, *(t for pair in pairs for t in pair))


def fp8_linear(x: Tensor, weight: Tensor, bias: Tensor | None, scaling: Fp8Scaling) -> Tensor:
    """F.linear(x, weight, bias) with its forward and backward matmuls in fp8."""
    return fp8_linears(x, [(weight, bias)], scaling)[0]
