"""The key/value cache of incremental decoding, sharded like the heads: each TP rank keeps only
its own heads' keys and values, [batch, heads / tp, max_length, head_dim] per layer, allocated
once for the longest sequence of the batch (prompt + new tokens), so decoding never reallocates.
"""

from __future__ import annotations

import torch
from torch import Tensor

from tpformer.layers.grouped_qkv import projected_kv_heads


class KVCache:
    """One layer's cache; `length` positions (the same for every sequence of the batch: prompts
    are left-padded) are filled."""

    def __init__(
        self,
        batch: int,
        local_heads: int,
        max_length: int,
        head_dim: int,
        *,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        shape = (batch, local_heads, max_length, head_dim)
        self.keys = torch.zeros(shape, dtype=dtype, device=device)
        self.values = torch.zeros(shape, dtype=dtype, device=device)
        self.length = 0

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Store the new positions' k, v [b, h/tp, s, d]; return every cached position's."""
        end = self.length + k.shape[2]
        if end > self.keys.shape[2]:
            raise ValueError(f"KV cache of {self.keys.shape[2]} positions cannot hold {end}")
        self.keys[:, :, self.length : end] = k
        self.values[:, :, self.length : end] = v
        self.length = end
        return self.keys[:, :, :end], self.values[:, :, :end]

    @property
    def nbytes(self) -> int:
        return self.keys.nbytes + self.values.nbytes


def kv_cache_bytes(
    *,
    layers: int,
    batch: int,
    kv_heads: int,
    tp: int,
    max_length: int,
    head_dim: int,
    itemsize: int,
) -> int:
    """Bytes of one rank's caches: keys and values of the key/value heads it projects (its
    share of them, or with grouped-query attention over more ranks than heads the one its
    query heads read: layers/grouped_qkv.py), unexpanded, every layer."""
    heads = projected_kv_heads(kv_heads, tp)
    return 2 * layers * batch * heads * max_length * head_dim * itemsize
