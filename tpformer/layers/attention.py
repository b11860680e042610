"""Self-attention with heads sharded across the TP group."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from tpformer.layers.attention_core import choose_core
from tpformer.layers.dropout import ParallelDropout
from tpformer.layers.grouped_qkv import GroupedQKV
from tpformer.layers.kv_cache import KVCache
from tpformer.layers.linear import ColumnParallelLinear, RowParallelLinear
from tpformer.layers.rotary import Rotary
from tpformer.parallel.context import ParallelContext
from tpformer.parallel.layout import divide
from tpformer.parallel.sequence_chunks import context_positions


class ParallelSelfAttention(nn.Module):
    """Fused QKV column-parallel projection, an attention core, row-parallel output.

    The QKV weight's rows are laid out per head as [head, (q, k, v), head_dim], so a contiguous
    TP slice holds num_heads / tp whole heads with their q, k and v (grouped-query attention:
    a query and a key/value weight, layers/grouped_qkv.py). Input and output are
    replicated [b, s, hidden]; one all-reduce forward (output) and one backward (input). With
    ctx.sequence_parallel both are [b, s/tp, hidden]: the QKV projection all-gathers the
    sequence, the output projection reduce-scatters it; the core always sees the whole sequence.
    With context parallelism (ctx.cp) the sequence is also split over the CP ring. The core
    (`self.core`: SDPA, the exact explicit core, or ring attention under CP) is chosen once,
    when the layer is built (layers/attention_core.py).
    """

    def __init__(
        self,
        hidden_size: int,
        num_heads: int,
        ctx: ParallelContext,
        *,
        attention_dropout: float,
        causal: bool,
        kv_heads: int = 0,
        bias: bool = True,
        qkv_bias: bool | None = None,
        rotary: Rotary | None = None,
        window: int = 0,
    ) -> None:
        """`bias`: the output projection's (and, unless `qkv_bias` says otherwise, the query,
        key and value projections')."""
        super().__init__()
        self.cp, self.causal, self.rotary = ctx.cp, causal, rotary
        if window and causal:
            raise ValueError("sliding-window attention is built for encoders (ModernBERT) only")
        self.head_dim = divide(hidden_size, num_heads, what="hidden_size")
        kv_heads = kv_heads or num_heads
        self.group = divide(num_heads, kv_heads, what="num_heads")
        """Query heads per key/value head (grouped-query attention; 1: multi-head)."""
        self.local_heads = divide(num_heads, ctx.tp.size, what="num_heads")
        self.head_offset = ctx.tp.rank * self.local_heads
        sp = ctx.sequence_parallel
        in_bias = bias if qkv_bias is None else qkv_bias
        self.qkv: ColumnParallelLinear | GroupedQKV
        if self.group == 1:
            self.local_kv_heads = self.local_heads
            rows = 3 * hidden_size
            self.qkv = ColumnParallelLinear(
                hidden_size, rows, ctx.tp, sequence_parallel=sp, bias=in_bias
            )
        else:  # layers/grouped_qkv.py: key/value heads split over TP, or replicated
            self.qkv = GroupedQKV(
                hidden_size, num_heads, kv_heads, ctx.tp, sequence_parallel=sp, bias=in_bias
            )
            self.local_kv_heads = self.qkv.local_kv_heads
        self.out = RowParallelLinear(
            hidden_size, hidden_size, ctx.tp, sequence_parallel=sp, bias=bias
        )
        self.dropout = ParallelDropout(attention_dropout, ctx.rng, heads=num_heads)
        self.core = choose_core(
            ctx,
            self.dropout,
            head_dim=self.head_dim,
            head_offset=self.head_offset,
            window=window,
            grouped=self.local_kv_heads < self.local_heads,
        )

    def forward(
        self,
        x: Tensor,
        mask: Tensor | None = None,
        cache: KVCache | None = None,
        positions: Tensor | None = None,
    ) -> Tensor:
        """x: [b, s, hidden] (or [b, s/tp, hidden]); mask: bool [b, 1, 1|s, s], True = attend
        (None: all, or causal). With a `cache` (decoding), x holds the new positions only: their
        keys and values are appended and the queries attend over every cached position, as
        `mask` [b, 1, s, cached] says. `positions` [b, s]: where rotary embeddings put each
        row (default: its place in the whole sequence, after the cached ones)."""
        q, k, v = self._project(x)
        b, s = q.shape[0], q.shape[2]
        if self.rotary is not None:
            q, k = self._rotate(q, k, cache, positions)
        causal = self.causal
        if cache is not None:
            if self.cp.size > 1:
                raise ValueError("decoding with a KV cache runs without context parallelism")
            causal = causal and cache.length == 0  # a decode step sees every cached position
            k, v = cache.append(k, v)
        ctx = self.core(q, k, v, mask, causal)  # grouped k, v: the core expands if it must
        ctx = ctx.transpose(1, 2).reshape(b, s, self.local_heads * self.head_dim)
        return self.out(ctx)

    def _project(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """q [b, heads/tp, s, d], k and v [b, local_kv_heads, s, d] of the whole sequence.
        Multi-head: the fused rows are laid out per head as [head, (q, k, v), head_dim], so a
        contiguous TP slice holds whole heads; grouped-query: layers/grouped_qkv.py."""
        if isinstance(self.qkv, GroupedQKV):
            return self.qkv(x)
        qkv = self.qkv(x)
        b, s = qkv.shape[:2]
        qkv = qkv.view(b, s, self.local_heads, 3, self.head_dim)
        q, k, v = (t.transpose(1, 2) for t in qkv.unbind(3))  # backward: one stack
        return q, k, v

    def _rotate(
        self, q: Tensor, k: Tensor, cache: KVCache | None, positions: Tensor | None
    ) -> tuple[Tensor, Tensor]:
        """Rotary embeddings at each row's position in the whole sequence: under context
        parallelism this rank's chunks of it, after a cache the positions past it."""
        assert self.rotary is not None
        s = q.shape[2]
        before = cache.length if cache is not None else 0
        longest = before + s * self.cp.size
        if positions is None:
            if self.cp.size > 1:
                positions = context_positions(longest, self.cp.rank, self.cp.size, q.device)
            else:
                positions = torch.arange(before, before + s, device=q.device)
        return self.rotary.rotate(q, k, positions, longest)
