"""The query, key and value projection of grouped-query attention (num_kv_heads < num_heads),
for any TP degree that divides num_heads and that num_kv_heads divides or is divided by.

Two parameters, the same in every layout (checkpoints reshard between them): `q` [heads x d,
hidden] with rows per query head, split over TP as any column-parallel weight, and `kv`
[kv_heads x (k, v) x d, hidden]. When TP divides the key/value heads, `kv` is split too and
each rank holds whole key/value heads. When there are fewer of them than TP ranks, every rank
holds all of `kv` (it is small: the point of grouped-query attention) and projects only the
key/value head its query heads read; each rank's gradient then covers that head's share of
the sequence's queries, and the engine sums `kv`'s gradient over the TP group (the marking of
sequence-parallel parameters), which is exact. (Megatron-core instead requires TP to divide
the key/value heads.) Under SP both weights read one sequence gather of the input.
"""

from __future__ import annotations

from torch import Tensor, nn

from tpformer.layers.linear import ColumnParallelLinear, linears, sequence_gathered_linears
from tpformer.parallel.comm import copy_to_tp
from tpformer.parallel.handle import GroupHandle
from tpformer.parallel.init import mark_sequence_parallel
from tpformer.parallel.layout import divide


def replicates_kv(kv_heads: int, tp: int) -> bool:
    """Whether each TP rank holds every key/value head (fewer heads than ranks)."""
    return kv_heads % tp != 0


def held_kv_heads(kv_heads: int, tp: int) -> int:
    """Key/value heads whose weights one TP rank holds: its share, or all when replicated."""
    return kv_heads if replicates_kv(kv_heads, tp) else kv_heads // tp


def projected_kv_heads(kv_heads: int, tp: int) -> int:
    """Key/value heads one TP rank projects: its share, or its query heads' one."""
    return 1 if replicates_kv(kv_heads, tp) else kv_heads // tp


class GroupedQKV(nn.Module):
    """x [b, s, hidden] (or [b, s/tp, hidden] under SP) -> q [b, heads/tp, s, d], k and v
    [b, local_kv_heads, s, d] of the whole sequence."""

    def __init__(
        self,
        hidden_size: int,
        num_heads: int,
        kv_heads: int,
        tp: GroupHandle,
        *,
        sequence_parallel: bool,
        bias: bool,
    ) -> None:
        super().__init__()
        self.tp, self.sequence_parallel = tp, sequence_parallel
        self.head_dim = divide(hidden_size, num_heads, what="hidden_size")
        self.local_heads = divide(num_heads, tp.size, what="num_heads")
        self.replicated = replicates_kv(kv_heads, tp.size)
        d = self.head_dim
        self.q = ColumnParallelLinear(hidden_size, num_heads * d, tp, bias=bias)
        self.kv: nn.Linear | ColumnParallelLinear
        if self.replicated:
            self.local_kv_heads = 1
            self.kv = nn.Linear(hidden_size, 2 * kv_heads * d, bias=bias)
            mark_sequence_parallel(self.kv)  # gradients summed over TP
            head = tp.rank * self.local_heads // (num_heads // kv_heads)
            self.kv_rows = (2 * d * head, 2 * d * (head + 1))
        else:
            self.local_kv_heads = kv_heads // tp.size
            self.kv = ColumnParallelLinear(hidden_size, 2 * kv_heads * d, tp, bias=bias)
            self.kv_rows = (0, 2 * d * self.local_kv_heads)

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        first, stop = self.kv_rows  # views of the parameters: nothing copied or kept
        kv_weight = self.kv.weight[first:stop]
        kv_bias = None if self.kv.bias is None else self.kv.bias[first:stop]
        if self.sequence_parallel:  # one gather for both
            pairs = [(self.q.weight, self.q.bias), (kv_weight, kv_bias)]
            q, kv = sequence_gathered_linears(x, pairs, self.tp, self.q.fp8)
        else:
            x = copy_to_tp(x, self.tp)  # the key/value matmul is in fp8 when the query's is
            q, kv = linears(x, [(self.q.weight, self.q.bias), (kv_weight, kv_bias)], self.q.fp8)
        b, s, d = q.shape[0], q.shape[1], self.head_dim
        q = q.view(b, s, self.local_heads, d)
        kv = kv.view(b, s, self.local_kv_heads, 2, d)
        return q.transpose(1, 2), kv[..., 0, :].transpose(1, 2), kv[..., 1, :].transpose(1, 2)
