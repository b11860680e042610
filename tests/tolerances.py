"""Named tolerances and the comparison helper the exactness tests share."""

from __future__ import annotations

import torch
from torch import Tensor

FP32_LAYER_REL = 1e-6
"""One layer in fp32: the same products, partial sums added in another order across TP ranks."""
FP32_MODEL_REL = 1e-5
"""A whole model in fp32: reduction-order noise compounds through the layers."""


def rel_err(actual: Tensor, expected: Tensor) -> float:
    """max |actual - expected| / max |expected| (0 when both are all zeros)."""
    actual, expected = actual.detach().double(), expected.detach().double()
    if actual.shape != expected.shape:
        raise AssertionError(f"shape {tuple(actual.shape)} != {tuple(expected.shape)}")
    scale = expected.abs().max().item()
    diff = (actual - expected).abs().max().item()
    return diff / scale if scale > 0 else diff


def assert_rel_close(actual: Tensor, expected: Tensor, rel: float, what: str = "") -> None:
    err = rel_err(actual, expected)
    assert err <= rel, f"{what}: relative error {err:.3e} > {rel:.0e}"


def shard(x: Tensor, dim: int, rank: int, size: int) -> Tensor:
    """Rank's equal chunk of x along dim (the reference for a TP-sharded tensor)."""
    return x.chunk(size, dim=dim)[rank]


def seeded(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)
