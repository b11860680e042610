"""Vocabulary-parallel embedding: rows of the table split across the TP group."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tpformer.layers.base import TPModule
from tpformer.parallel.comm import reduce_from_tp, reduce_scatter_sequence
from tpformer.parallel.handle import GroupHandle
from tpformer.parallel.init import mark_sharded
from tpformer.parallel.layout import pad_to_multiple


def padded_vocab_size(vocab_size: int, tp_size: int, pad_to_multiple_of: int) -> int:
    """Vocabulary rounded up to a multiple of pad_to_multiple_of * tp (0 = no padding)."""
    if pad_to_multiple_of < 0:
        raise ValueError(f"pad_vocab_to={pad_to_multiple_of} must be >= 0 (0 turns padding off)")
    if pad_to_multiple_of == 0:
        if vocab_size % tp_size != 0:
            raise ValueError(
                f"vocab_size={vocab_size} is not divisible by tp={tp_size}; "
                f"set model.pad_vocab_to=128 (or any value > 0) to pad it"
            )
        return vocab_size
    return pad_to_multiple(vocab_size, pad_to_multiple_of * tp_size)


class VocabParallelEmbedding(TPModule):
    """Embedding whose rows (the vocabulary, padded) are split across the TP group.

    Each rank looks up the ids in its own range, zeroes the others, and one all-reduce sums
    the partial results. Padding rows are never indexed, so they never receive gradient.
    Output is replicated: [..., embedding_dim]; with sequence_parallel, ids [b, s] give this
    rank's sequence chunk [b, s/tp, dim] through a reduce-scatter instead.
    `sparse` (as nn.Embedding's): the weight gradient holds only the rows looked up, instead of
    a dense table allocated, zeroed and added every backward (the engine turns it on).
    """

    def __init__(
        self,
        num_embeddings: int,
        embedding_dim: int,
        tp: GroupHandle,
        *,
        pad_to_multiple_of: int = 0,
        sequence_parallel: bool = False,
        device: torch.device | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self.tp, self.sequence_parallel = tp, sequence_parallel
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        self.padded_size = padded_vocab_size(num_embeddings, tp.size, pad_to_multiple_of)
        self.rows_per_rank = self.padded_size // tp.size
        self.vocab_start = tp.rank * self.rows_per_rank
        weight = torch.zeros(self.rows_per_rank, embedding_dim, device=device, dtype=dtype)
        self.weight = mark_sharded(nn.Parameter(weight), 0, num_embeddings)
        self.sparse = False

    def forward(self, ids: Tensor) -> Tensor:  # ids: [...] -> [..., dim]
        if self.tp.size == 1:
            return F.embedding(ids, self.weight, sparse=self.sparse)
        local = ids - self.vocab_start
        outside = (local < 0) | (local >= self.rows_per_rank)
        out = F.embedding(local.masked_fill(outside, 0), self.weight, sparse=self.sparse)
        out = out.masked_fill(outside.unsqueeze(-1), 0.0)
        if self.sequence_parallel:
            return reduce_scatter_sequence(out, self.tp)
        return reduce_from_tp(out, self.tp)

    def extra_repr(self) -> str:
        return (
            f"{self.num_embeddings} (padded {self.padded_size}), {self.embedding_dim}, "
            f"tp={self.tp.size}"
        )
