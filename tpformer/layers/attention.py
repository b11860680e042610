"""Self-attention with heads sharded across the TP group."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tpformer.layers.dropout import ParallelDropout
from tpformer.layers.grouped_qkv import GroupedQKV
from tpformer.layers.kv_cache import KVCache
from tpformer.layers.linear import ColumnParallelLinear, RowParallelLinear
from tpformer.layers.ring_attention import RingSpec, ring_attention
from tpformer.layers.rotary import Rotary
from tpformer.parallel.context import ParallelContext
from tpformer.parallel.layout import divide
from tpformer.parallel.random import eager_island
from tpformer.parallel.sequence_chunks import context_positions


class ParallelSelfAttention(nn.Module):
    """Fused QKV column-parallel projection, SDPA core, row-parallel output.

    The QKV weight's rows are laid out per head as [head, (q, k, v), head_dim], so a contiguous
    TP slice holds num_heads / tp whole heads with their q, k and v (grouped-query attention:
    a query and a key/value weight, layers/grouped_qkv.py). Input and output are
    replicated [b, s, hidden]; one all-reduce forward (output) and one backward (input). With
    ctx.sequence_parallel both are [b, s/tp, hidden]: the QKV projection all-gathers the
    sequence, the output projection reduce-scatters it; the core always sees the whole sequence.
    With context parallelism (ctx.cp) the sequence is also split over the CP ring: the core is
    ring attention over it (layers/ring_attention.py). The core is otherwise
    `scaled_dot_product_attention` (flash / memory-efficient kernels), with attention
    dropout inside it under parallel.rng=fast; under exact with attention dropout active in
    training it is computed explicitly, so the mask can be the TP=1 model's (layers/dropout.py).
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
        self.tp, self.cp, self.causal, self.rotary = ctx.tp, ctx.cp, causal, rotary
        self.reach = window // 2
        """Sliding-window attention: keys at most this many positions away (0: all)."""
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
        self.expand = self.local_heads // self.local_kv_heads
        """Query heads per key/value head on this rank (all of them when replicated)."""
        self.out = RowParallelLinear(
            hidden_size, hidden_size, ctx.tp, sequence_parallel=sp, bias=bias
        )
        self.dropout = ParallelDropout(attention_dropout, ctx.rng, heads=num_heads)

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
        if self.reach:
            mask = self._windowed(mask, s, q.device)
        if cache is not None:
            if self.cp.size > 1:
                raise ValueError("decoding with a KV cache runs without context parallelism")
            causal = causal and cache.length == 0  # a decode step sees every cached position
            k, v = cache.append(k, v)
        if self.expand > 1:  # each query head's key and value head, as HF's repeat_kv
            k, v = k.repeat_interleave(self.expand, dim=1), v.repeat_interleave(self.expand, dim=1)
        ctx = self.core(q, k, v, mask, causal)
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

    def _windowed(self, mask: Tensor | None, s: int, device: torch.device) -> Tensor:
        """`mask` and the band |query - key| <= reach over the whole sequence of s positions:
        one bool mask for SDPA's fused kernels (memory-efficient on CUDA: flash takes no mask).
        Context parallelism is refused for local layers (config/rules/model.py)."""
        index = torch.arange(s, device=device)
        band = (index[:, None] - index[None, :]).abs() <= self.reach
        return band if mask is None else mask & band

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

    def core(
        self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, causal: bool | None = None
    ) -> Tensor:
        """softmax(q k^T / sqrt(d) + mask) [dropout] @ v -> [b, h/tp, s, d]; what selective
        recomputation wraps. Without a mask, `causal` (default: the layer's) masks the future."""
        causal = self.causal if causal is None else causal
        if self.cp.size > 1:
            return self._ring_core(q, k, v, mask, causal)
        if self.training and self.dropout.p > 0:
            return self._dropping_core(q, k, v, mask, causal)
        return self._fused_core(q, k, v, mask, causal, 0.0)

    def _dropping_core(
        self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, causal: bool
    ) -> Tensor:
        """The core with attention dropout: fast, SDPA's own dropout from this call's stream
        (seeded here, or, inside a compiled block, before the block: `device_stream_site`);
        exact, the explicit core with the TP=1 model's masks."""
        if not self.dropout.rng.fast:
            return self._explicit_core(q, k, v, mask, causal)
        if torch.compiler.is_compiling():
            return self._fused_core(q, k, v, mask, causal, self.dropout.p)
        assert self.dropout.site is not None, "call assign_dropout_sites(model)"
        with self.dropout.rng.forked(q.device, self.dropout.site):
            return self._fused_core(q, k, v, mask, causal, self.dropout.p)

    def device_stream_site(self) -> int | None:
        """fast mode: the key of the one draw this layer makes from the device's default
        generator (SDPA's dropout), which a compiled block seeds before it runs
        (engine/compiled.py); None when it draws nothing (exact, eval, no dropout, CP)."""
        rng, dropout = self.dropout.rng, self.dropout
        if not rng.fast or dropout.p == 0 or self.cp.size > 1:
            return None
        return dropout.site

    @eager_island
    def _ring_core(
        self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, causal: bool
    ) -> Tensor:
        """Context parallelism: this CP rank's queries over the whole sequence, the keys and
        values passed around the CP ring (layers/ring_attention.py). `mask` can only be a key
        padding mask [b, 1, 1, s] over the whole sequence (the models pass that under CP)."""
        n = q.shape[-2]
        total = n * self.cp.size
        if mask is not None and (mask.shape[-2] != 1 or mask.shape[-1] != total):
            raise ValueError(
                f"context parallelism takes a key padding mask [b, 1, 1, {total}], got "
                f"{list(mask.shape)}: causal masks are built from positions inside the ring"
            )
        positions = [
            context_positions(total, r, self.cp.size, q.device) for r in range(self.cp.size)
        ]
        keep, held = self.dropout.ring_keep(q, self.head_offset, positions, self.cp.rank)
        spec = RingSpec(
            cp=self.cp,
            positions=positions,
            key_padding=None if mask is None else mask[:, 0, 0, :],
            causal=causal,
            scale=1.0 / math.sqrt(self.head_dim),
            keep=keep,
            held=held,
        )
        return ring_attention(q, k, v, spec)

    @staticmethod
    def _fused_core(
        q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, causal: bool, dropout_p: float
    ) -> Tensor:
        if q.is_meta:
            return accelerator_sdpa(q, k, v, mask, causal, dropout_p)
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, dropout_p=dropout_p, is_causal=causal and mask is None
        )

    @eager_island
    def _explicit_core(
        self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, causal: bool
    ) -> Tensor:
        """exact mode: the probabilities materialized, dropped with the TP=1 model's masks (a
        per-sample generator loop: kept out of compiled graphs)."""
        scores = torch.matmul(q, k.transpose(-1, -2)) * (1.0 / math.sqrt(self.head_dim))
        if mask is None and causal:
            s = q.shape[-2]
            mask = torch.ones(s, s, dtype=torch.bool, device=q.device).tril()
        if mask is not None:
            scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
        probs = self.dropout(torch.softmax(scores, dim=-1), head_offset=self.head_offset)
        return torch.matmul(probs, v)


def accelerator_sdpa(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, causal: bool, dropout_p: float
) -> Tensor:
    """The fused kernel CUDA's SDPA picks, called by name: on the meta device (dry runs,
    train/dry_run.py) SDPA takes its math path, which keeps the [b, h, s, s] probabilities that
    no accelerator run keeps. Flash for 16-bit without a mask; otherwise memory-efficient
    attention, with a boolean mask turned into an additive bias as SDPA turns it."""
    if mask is None and q.dtype in (torch.float16, torch.bfloat16):
        return torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, dropout_p, causal)[0]
    bias = None
    if mask is not None:
        zeros = torch.zeros(mask.shape, dtype=q.dtype, device=q.device)
        bias = zeros.masked_fill(~mask, float("-inf")).expand(*q.shape[:3], k.shape[-2])
    causal = causal and mask is None
    return torch.ops.aten._scaled_dot_product_efficient_attention(
        q, k, v, bias, True, dropout_p, causal
    )[0]
