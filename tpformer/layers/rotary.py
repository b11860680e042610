"""Rotary position embeddings (RoPE), with the scaling variants Hugging Face's Llama configs
carry (linear, dynamic NTK, llama3), applied to queries and keys by their position in the whole
sequence, so every layout (TP, SP, CP, a KV cache) rotates a position the same way."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from tpformer.config.schema import RotaryConfig


class Rotary:
    """cos/sin of each position for a head_dim; `rotate(q, k, positions, longest)`.
    `max_positions`: the model's context (the original context of scaling, unless the config
    names one); `local`: a local-attention layer's, with config.local_theta as its base
    (ModernBERT)."""

    def __init__(
        self, config: RotaryConfig, head_dim: int, max_positions: int, *, local: bool = False
    ) -> None:
        self.config, self.head_dim = config, head_dim
        self.theta = config.base(local=local)
        self.original = config.original_max_positions or max_positions

    def inverse_frequencies(self, longest: int, device: torch.device) -> Tensor:
        """theta^(-2i/d), scaled as config.scaling says (fp32; HF's formulas)."""
        c, d = self.config, self.head_dim
        base = self.theta
        if c.scaling == "dynamic" and longest > self.original:
            grown = c.factor * longest / self.original - (c.factor - 1)
            base = base * grown ** (d / (d - 2))
        exponents = torch.arange(0, d, 2, dtype=torch.int64, device=device).float() / d
        inverse = 1.0 / base**exponents
        if c.scaling == "linear":
            return inverse / c.factor
        if c.scaling == "llama3":
            return self._llama3(inverse)
        return inverse

    def _llama3(self, inverse: Tensor) -> Tensor:
        """Llama 3.1: long wavelengths divided by the factor, short ones kept, those between
        interpolated smoothly."""
        c = self.config
        low, high = self.original / c.low_freq_factor, self.original / c.high_freq_factor
        wavelength = 2 * math.pi / inverse
        scaled = torch.where(wavelength > low, inverse / c.factor, inverse)
        smooth = (self.original / wavelength - c.low_freq_factor) / (
            c.high_freq_factor - c.low_freq_factor
        )
        between = (1 - smooth) * scaled / c.factor + smooth * scaled
        middle = (wavelength >= high) & (wavelength <= low)
        return torch.where(middle, between, scaled)

    def rotate(
        self, q: Tensor, k: Tensor, positions: Tensor, longest: int
    ) -> tuple[Tensor, Tensor]:
        """q and k [b, heads, n, d] at `positions` ([n], or [b, n] per row) of a sequence
        `longest` positions long (the dynamic variant's base depends on it): x cos +
        rotate_half(x) sin, the angles computed once, in fp32."""
        angles = positions.float()[..., None] * self.inverse_frequencies(longest, q.device)
        angles = torch.cat([angles, angles], dim=-1)  # [n, d] or [b, n, d]
        if angles.dim() == 3:
            angles = angles[:, None]  # over the heads
        cos, sin = angles.cos().to(q.dtype), angles.sin().to(q.dtype)
        return _rotated(q, cos, sin), _rotated(k, cos, sin)


def _rotated(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    first, second = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-second, first], dim=-1) * sin
