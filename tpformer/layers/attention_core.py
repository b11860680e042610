"""The attention core, softmax(q k^T / sqrt(d) + mask) [dropout] @ v over [b, heads, s, d],
chosen once per layer when the model is built (`choose_core`), so the attention layer composes
its projections with one core instead of dispatching among kernels at every call:

- `FusedCore`: `scaled_dot_product_attention` (flash / memory-efficient kernels on CUDA); under
  parallel.rng=fast its attention dropout is the kernel's own, drawn from a stream keyed by the
  layer (a compiled block seeds it before it runs: `device_stream_site`).
- `ExactCore`: parallel.rng=exact with attention dropout: in training the probabilities are
  materialized and dropped with the TP=1 model's masks (layers/dropout.py); in evaluation,
  with nothing to draw, the fused kernel.
- `RingCore`: context parallelism: this rank's queries over the whole sequence, keys and values
  passed around the CP ring (layers/ring_attention.py); a local layer's window is built per
  block from positions, and blocks out of its reach are skipped.

A local (sliding-window) layer gives its core a reach: keys at most that many positions away.
Where flash can run it (an accelerator, 16-bit, no padding mask, no attention dropout to draw)
the window is flash's own (`torch.nn.attention.varlen`, `window_size`): no [s, s] band is built
or kept, so a local layer holds what a global flash layer holds; otherwise the band is a mask.
Grouped-query attention hands the core fewer key/value heads than query heads: SDPA's
`enable_gqa` reads them in place where its kernel takes groups (`fused_sdpa`); the explicit and
ring cores expand them. Each core names its kernel and why it was chosen (`describe`), for the
startup plan.
"""

from __future__ import annotations

import math
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tpformer.layers.dropout import ParallelDropout
from tpformer.layers.ring_attention import RingSpec, ring_attention
from tpformer.parallel.context import ParallelContext
from tpformer.parallel.random import eager_island
from tpformer.parallel.sequence_chunks import context_positions


class AttentionCore(nn.Module):
    """One kernel's core. It holds no weights; the attention layer owns the dropout (its
    module name keys the random streams, the same in every layout), the core uses it."""

    kernel: ClassVar[str]
    dropout: ParallelDropout

    def __init__(
        self,
        dropout: ParallelDropout,
        head_dim: int,
        head_offset: int,
        reach: int,
        grouped: bool = False,
    ):
        super().__init__()
        self.__dict__["dropout"] = dropout  # used, not owned: not a submodule
        self.scale = 1.0 / math.sqrt(head_dim)
        self.head_offset = head_offset
        """This rank's first head among all heads (the exact masks' rows)."""
        self.reach = reach
        """Sliding-window attention: keys at most this many positions away (0: all)."""
        self.grouped = grouped
        """Fewer key/value heads than query heads (grouped-query attention)."""

    def forward(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, causal: bool) -> Tensor:
        """q [b, heads, s, d]; k, v [b, kv_heads, s, d] (kv_heads divides heads: grouped-query
        attention); `mask`: bool [b, 1, 1|s, s], True = attend (None: all, or the future masked
        when `causal`). Selective recomputation wraps this call."""
        if self.reach:
            p = self.dropout.p if self.dropout.training else 0.0
            if windowed_flash_runs(q, mask, p, causal):
                return windowed_flash(q, k, v, self.reach)
            mask = self._banded(mask, q.shape[-2], q.device)
        return self.attend(q, k, v, mask, causal)

    def attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, causal: bool) -> Tensor:
        raise NotImplementedError

    def describe(self) -> str:
        """The kernel and why, as the startup plan prints it (a local layer: its window)."""
        if not self.reach:
            return self.kernel
        window = f"{self.kernel}, window {2 * self.reach}"
        if self.dropout.p > 0:  # flash_runs_the_window: never while training
            return f"{window} (a band mask: flash's window draws no attention dropout)"
        return (
            f"{window} (flash's varlen window for unmasked 16-bit batches on an accelerator; "
            "else a band mask)"
        )

    def device_stream_site(self) -> int | None:
        """The key of the one draw this core makes from the device's default generator, which
        a compiled block seeds before it runs (engine/compiled.py); None: it draws nothing."""
        return None

    def _banded(self, mask: Tensor | None, s: int, device: torch.device) -> Tensor:
        """`mask` and the band |query - key| <= reach over the whole sequence of s positions:
        one bool mask for SDPA's fused kernels (memory-efficient on CUDA: flash takes no mask).
        Under context parallelism the ring builds the window itself (RingCore)."""
        index = torch.arange(s, device=device)
        band = (index[:, None] - index[None, :]).abs() <= self.reach
        return band if mask is None else mask & band


class FusedCore(AttentionCore):
    """`scaled_dot_product_attention`, its own dropout under parallel.rng=fast."""

    kernel = "sdpa"

    def attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, causal: bool) -> Tensor:
        p = self.dropout.p if self.dropout.training else 0.0
        if p == 0:
            return fused_sdpa(q, k, v, mask, causal, 0.0)
        if torch.compiler.is_compiling():  # seeded before the block (engine/compiled.py)
            return fused_sdpa(q, k, v, mask, causal, p)
        assert self.dropout.site is not None, "call assign_dropout_sites(model)"
        with self.dropout.rng.forked(q.device, self.dropout.site):
            return fused_sdpa(q, k, v, mask, causal, p)

    def describe(self) -> str:
        drop = ", the kernel's dropout (rng=fast)" if self.dropout.p else ""
        groups = (
            ", grouped key/value heads in place when 16-bit and unmasked" if self.grouped else ""
        )
        return f"{super().describe()}{drop}{groups}"

    def device_stream_site(self) -> int | None:
        return self.dropout.site if self.dropout.p > 0 else None


class ExactCore(AttentionCore):
    """parallel.rng=exact with attention dropout: the probabilities materialized in training."""

    kernel = "explicit"

    def attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, causal: bool) -> Tensor:
        if not self.dropout.training:
            return fused_sdpa(q, k, v, mask, causal, 0.0)
        return self._explicit(q, *expanded_kv(q, k, v), mask, causal)

    def describe(self) -> str:
        return f"{super().describe()} (rng=exact: the TP=1 model's dropout masks; sdpa in eval)"

    @eager_island
    def _explicit(
        self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, causal: bool
    ) -> Tensor:
        """The probabilities materialized, dropped with the TP=1 model's masks (a per-sample
        generator loop: kept out of compiled graphs)."""
        scores = torch.matmul(q, k.transpose(-1, -2)) * self.scale
        if mask is None and causal:
            s = q.shape[-2]
            mask = torch.ones(s, s, dtype=torch.bool, device=q.device).tril()
        if mask is not None:
            scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
        probs = self.dropout(torch.softmax(scores, dim=-1), head_offset=self.head_offset)
        return torch.matmul(probs, v)


class RingCore(AttentionCore):
    """Context parallelism: the keys and values passed around the CP ring."""

    kernel = "ring"

    def __init__(
        self,
        dropout: ParallelDropout,
        head_dim: int,
        head_offset: int,
        ctx: ParallelContext,
        reach: int = 0,
    ):
        super().__init__(dropout, head_dim, head_offset, reach=reach)
        self.cp = ctx.cp

    def forward(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, causal: bool) -> Tensor:
        """The window is the ring's own (built per block from positions), not a band mask."""
        return self.attend(q, k, v, mask, causal)

    def attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, causal: bool) -> Tensor:
        return self._ring(q, *expanded_kv(q, k, v), mask, causal)

    def describe(self) -> str:
        ring = f"{self.kernel} over parallel.context={self.cp.size}"
        if not self.reach:
            return ring
        return (
            f"{ring}, window {2 * self.reach} (blocks out of its reach skipped; keys and values "
            "still pass the whole ring)"
        )

    @eager_island
    def _ring(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, causal: bool) -> Tensor:
        """This CP rank's queries over the whole sequence. `mask` can only be a key padding
        mask [b, 1, 1, s] over the whole sequence (the models pass that under CP)."""
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
            scale=self.scale,
            keep=keep,
            held=held,
            reach=self.reach,
        )
        return ring_attention(q, k, v, spec)


def choose_core(
    ctx: ParallelContext,
    dropout: ParallelDropout,
    *,
    head_dim: int,
    head_offset: int,
    window: int,
    grouped: bool = False,
) -> AttentionCore:
    """The layer's core: the ring under context parallelism (a local layer's window built in
    it), the explicit core where exact dropout must draw the TP=1 masks, otherwise SDPA (which
    reads `grouped` key/value heads in place where its kernel can: fused_sdpa)."""
    if ctx.cp.size > 1:
        return RingCore(dropout, head_dim, head_offset, ctx, reach=window // 2)
    exact = dropout.p > 0 and not dropout.rng.fast
    core = ExactCore if exact else FusedCore
    return core(dropout, head_dim, head_offset, reach=window // 2, grouped=grouped)


def flash_runs_the_window(
    *, accelerator: bool, sixteen_bit: bool, masked: bool, dropout_p: float, causal: bool
) -> bool:
    """Where a local layer's sliding window is flash's own (`windowed_flash`), the one rule the
    core runs by and the planner prices by (planner/memory.local_attention_bytes): on an
    accelerator (CUDA, or meta, where the dry run prices a GPU run), 16-bit, no mask (padding
    or packed documents), no attention dropout to draw (the kernel has none) and bidirectional
    (the window is symmetric). Elsewhere, the CPU among them, the band is a mask."""
    return accelerator and sixteen_bit and not masked and dropout_p == 0 and not causal


def windowed_flash_runs(q: Tensor, mask: Tensor | None, dropout_p: float, causal: bool) -> bool:
    """flash_runs_the_window for this call's queries and mask."""
    return flash_runs_the_window(
        accelerator=q.device.type in ("cuda", "meta"),
        sixteen_bit=q.dtype in (torch.float16, torch.bfloat16),
        masked=mask is not None,
        dropout_p=dropout_p,
        causal=causal,
    )


def windowed_flash(q: Tensor, k: Tensor, v: Tensor, reach: int) -> Tensor:
    """Bidirectional sliding-window attention, keys at most `reach` positions from the query,
    through flash's variable-length kernel (each sample one sequence of the flattened batch;
    window_size=(reach, reach)); grouped key/value heads read in place. q [b, heads, s, d];
    k, v [b, kv_heads, s, d] -> [b, heads, s, d]."""
    from torch.nn.attention.varlen import varlen_attn

    b, heads, s, d = q.shape

    def flat(x: Tensor) -> Tensor:
        return x.transpose(1, 2).reshape(b * s, x.shape[1], d)

    starts = torch.arange(0, (b + 1) * s, s, dtype=torch.int32, device=q.device)
    out = varlen_attn(
        flat(q),
        flat(k),
        flat(v),
        starts,
        starts,
        s,
        s,
        window_size=(reach, reach),
        enable_gqa=k.shape[1] != heads,
    )
    assert isinstance(out, Tensor)
    return out.view(b, s, heads, d).transpose(1, 2)


def expanded_kv(q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
    """k and v with one head per query head (grouped-query attention: each key/value head
    repeated for its group, as HF's repeat_kv); as they are for multi-head attention."""
    group = q.shape[1] // k.shape[1]
    if group == 1:
        return k, v
    return k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)


def takes_groups(q: Tensor, mask: Tensor | None) -> bool:
    """Whether SDPA's kernel for this call reads grouped key/value heads in place
    (`enable_gqa`): flash does, for 16-bit inputs without a mask; CUDA's memory-efficient
    kernel does not (SDPA would fall back to its math path, which keeps the [b, h, s, s]
    probabilities), so there the keys and values are expanded first. The CPU follows the same
    rule, so what it proves is what a GPU runs."""
    return mask is None and q.dtype in (torch.float16, torch.bfloat16)


def fused_sdpa(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, causal: bool, dropout_p: float
) -> Tensor:
    """SDPA, `causal` applying only without a mask (a mask already says what is attended);
    grouped key/value heads read in place where the kernel takes them (`takes_groups`)."""
    grouped = k.shape[1] != q.shape[1]
    if grouped and not takes_groups(q, mask):
        k, v = expanded_kv(q, k, v)
        grouped = False
    if q.is_meta:
        return accelerator_sdpa(q, k, v, mask, causal, dropout_p)
    return F.scaled_dot_product_attention(
        q,
        k,
        v,
        attn_mask=mask,
        dropout_p=dropout_p,
        is_causal=causal and mask is None,
        enable_gqa=grouped,
    )


def accelerator_sdpa(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, causal: bool, dropout_p: float
) -> Tensor:
    """The fused kernel CUDA's SDPA picks, called by name: on the meta device (dry runs,
    train/dry_run.py) SDPA takes its math path, which keeps the [b, h, s, s] probabilities that
    no accelerator run keeps. Flash for 16-bit without a mask (grouped key/value heads read in
    place); otherwise memory-efficient attention (heads expanded by `fused_sdpa`), with a
    boolean mask turned into an additive bias as SDPA turns it."""
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
