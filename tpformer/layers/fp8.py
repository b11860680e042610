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
    one already)."""
    short = -t.shape[0] % KERNEL_MULTIPLE
    return t if short == 0 else torch.nn.functional.pad(t, (0, 0, 0, short))


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
    (cast here to e5m2 with `g_scale`), xq [m, in] (rows padded) and wq [out, in] as the
    forward cast them."""
    rows = grad.shape[0]
    gq = to_fp8(rows_padded(grad), g_scale, BACKWARD_DTYPE)
    grad_x = scaled_mm(gq, g_scale, wq.t().contiguous(), w_scale, grad.dtype)[:rows]
    grad_w = scaled_mm(gq.t().contiguous(), g_scale, xq.t().contiguous(), x_scale, w_dtype)
    return grad_x, grad_w


class _Fp8Linear(torch.autograd.Function):
    """y = x @ W.T + b with all three matmuls in fp8; keeps the fp8 input (1 byte an element)
    instead of the compute-dtype one, and the weight itself (a parameter, held anyway), cast
    again in backward with the forward's scale (as torchao's float8 linear does)."""

    @staticmethod
    def forward(
        ctx, x: Tensor, weight: Tensor, bias: Tensor | None, scaling: Fp8Scaling
    ) -> Tensor:
        x2 = x.reshape(-1, x.shape[-1])
        scales = scaling.scales(FORWARD_DTYPE, x2, weight)
        xq = to_fp8(rows_padded(x2), scales[0], FORWARD_DTYPE)
        wq = to_fp8(weight, scales[1], FORWARD_DTYPE)
        y = scaled_mm(xq, scales[0], wq, scales[1], x.dtype)[: x2.shape[0]]
        if bias is not None:
            y = y + bias
        ctx.save_for_backward(xq, weight, scales)
        ctx.scaling, ctx.has_bias, ctx.x_shape = scaling, bias is not None, x.shape
        return y.view(*x.shape[:-1], weight.shape[0])

    @staticmethod
    def backward(ctx, grad: Tensor):
        xq, weight, scales = ctx.saved_tensors
        g2 = grad.reshape(-1, grad.shape[-1])
        g_scale = ctx.scaling.scales(BACKWARD_DTYPE, g2)[0]
        wq = to_fp8(weight, scales[1], FORWARD_DTYPE)
        grad_x, grad_w = fp8_grads(g2, xq, scales[0], wq, scales[1], g_scale, weight.dtype)
        grad_b = g2.sum(0) if ctx.has_bias else None
        return grad_x.view(ctx.x_shape), grad_w, grad_b, None


def fp8_linear(x: Tensor, weight: Tensor, bias: Tensor | None, scaling: Fp8Scaling) -> Tensor:
    """F.linear(x, weight, bias) with its forward and backward matmuls in fp8."""
    return _Fp8Linear.apply(x, weight, bias, scaling)
