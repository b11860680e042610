"""Tensor-parallel nn.Modules built on tpformer.parallel; each takes the narrowest handle it
needs."""

from tpformer.layers.base import TPModule
from tpformer.layers.dropout import ParallelDropout, assign_dropout_sites
from tpformer.layers.embedding import VocabParallelEmbedding
from tpformer.layers.linear import ColumnParallelLinear, RowParallelLinear
from tpformer.layers.loss import vocab_parallel_cross_entropy

__all__ = [
    "ColumnParallelLinear",
    "ParallelDropout",
    "RowParallelLinear",
    "TPModule",
    "VocabParallelEmbedding",
    "assign_dropout_sites",
    "vocab_parallel_cross_entropy",
]
