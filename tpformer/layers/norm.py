"""The normalization a model config names: LayerNorm (with or without bias) or RMSNorm.

RMSNorm is one autograd function that keeps only its input and the per-row reciprocal root
mean square for backward, as PyTorch's fused LayerNorm does; PyTorch's composite RMSNorm keeps
the normalized input too (4 bytes per element more per norm in fp32), and in 16-bit precision
its float32 copy of the input and casts as well (measured on the meta device: about 10 bytes
per element more per norm in bf16)."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from tpformer.config.schema import ModelConfig
from tpformer.parallel.init import ones_init, set_init


def make_norm(config: ModelConfig) -> nn.Module:
    """config.norm's kind over the hidden size, with its epsilon (and bias, for LayerNorm)."""
    norm = config.norm
    if norm.kind == "rmsnorm":
        return RMSNorm(config.hidden_size, eps=norm.eps)
    return nn.LayerNorm(config.hidden_size, eps=norm.eps, bias=norm.bias)


class RMSNorm(nn.Module):
    """x / sqrt(mean(x^2) + eps) * weight over the last dimension, computed in float32."""

    def __init__(self, hidden_size: int, *, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden_size))
        set_init(self.weight, ones_init)

    def forward(self, x: Tensor) -> Tensor:
        return _RMSNorm.apply(x, self.weight, self.eps)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}"


class _RMSNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: Tensor, weight: Tensor, eps: float) -> Tensor:
        wide = x.to(torch.promote_types(x.dtype, torch.float32))
        rstd = torch.rsqrt(wide.pow(2).mean(-1, keepdim=True) + eps)
        ctx.save_for_backward(x, weight, rstd)
        return (wide * rstd * weight.to(wide.dtype)).to(x.dtype)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, Tensor, None]:
        x, weight, rstd = ctx.saved_tensors
        normalized = x.to(rstd.dtype) * rstd
        wide = grad.to(rstd.dtype)
        grad_weight = (wide * normalized).reshape(-1, normalized.shape[-1]).sum(0)
        scaled = wide * weight.to(rstd.dtype)
        mean = (scaled * normalized).mean(-1, keepdim=True)
        grad_x = rstd * (scaled - normalized * mean)
        return grad_x.to(x.dtype), grad_weight.to(weight.dtype), None
