"""Ring attention: the attention core over a sequence split across the context-parallel ring.

Each CP rank holds the queries, keys and values of its positions (tpformer/parallel/
sequence_chunks.py). Forward: the keys and values travel once around the ring (cp - 1 steps);
at each step the rank sends the block it holds to the next rank while it computes the
attention of its queries against that block, and merges the block's partial result into its
running output with the log-sum-exp rule:

    L = log(exp(L) + exp(lse_j)),  O = O exp(L_old - L) + O_j exp(lse_j - L)

which is exact: the blocks' softmax denominators are combined as sums, and dropout, applied to
each block's probabilities, is linear in them. Only q, k, v, the output and L are kept for
backward (activation memory O(n d) per head, no [s, s] tensor); backward recomputes each
block's probabilities from L (as flash attention does), sends the keys and values around again
and, beside them, the gradients of each block's keys and values, which every rank adds its part
to and which arrive back at their owner after cp hops.

Masks are built per block from global positions: causal (key position <= query position), a
sliding window (|query - key| <= reach: a local layer) and the key padding mask of the whole
sequence [b, s] (every rank has it). A block whose keys all lie out of the window's reach is
skipped (its keys and values still pass through on their way around the ring). A query row
that no key may attend to anywhere gets a zero output (rows like that carry no loss). Dropout
masks come from the caller's `keep(src)`: the same mask in forward and backward, keyed by
global query and key positions in exact mode (layers/dropout.py).

The block core is written in plain tensor ops (two matmuls, exp, one reduction per block), so
the CPU proves it exact; on GPUs the fused flash kernels with log-sum-exp outputs are what it
would call instead (docs/parallel/context.md).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from tpformer.parallel.comm import ring_shift_async
from tpformer.parallel.handle import GroupHandle
from tpformer.parallel.sequence_chunks import causal_block, within_reach

KV_TAG, GRAD_TAG = 0x4B56, 0x4456
"""gloo tags of the two rings in flight (keys/values and their gradients)."""


@dataclass
class RingSpec:
    """What one ring-attention call needs besides q, k and v."""

    cp: GroupHandle
    positions: list[Tensor]
    """Global positions held by each CP rank ([n] each, by CP rank)."""
    key_padding: Tensor | None
    """bool [b, s] over the whole sequence, True = a token (None: no padding)."""
    causal: bool
    scale: float
    keep: Callable[[int], Tensor | None]
    """Dropout: the scaled keep mask [b, h, n, n] of this rank's queries against CP rank
    src's keys (the same tensor when asked again in backward), or None without dropout."""
    held: tuple[Tensor, ...] = ()
    """Tensors `keep` holds until backward (exact-mode masks): saved with the Function's own,
    so they count as its saved activations."""
    reach: int = 0
    """Sliding-window attention: keys at most this many positions from the query (0: all)."""


@dataclass(frozen=True)
class _Block:
    """The part of the block (this rank's queries x src's keys) that is computed: query rows
    from `rows`, key columns below `cols` (causal: the rest is all future, see
    sequence_chunks.causal_block); the whole block otherwise."""

    src: int
    rows: int
    cols: int
    skipped: bool = False
    """Out of the window's reach: nothing of it is computed."""

    @classmethod
    def of(cls, spec: RingSpec, n: int, src: int) -> _Block:
        skipped = not within_reach(n, spec.cp.size, spec.cp.rank, src, spec.reach)
        if not spec.causal:
            return cls(src, 0, n, skipped)
        return cls(src, *causal_block(n, spec.cp.rank, src), skipped)


def _allowed(spec: RingSpec, block: _Block) -> Tensor | None:
    """bool [b | 1, 1, rows, cols]: which (query, key) pairs of the block may attend."""
    allowed = None
    k_pos = spec.positions[block.src][: block.cols]
    q_pos = spec.positions[spec.cp.rank][block.rows :]
    if spec.causal:
        allowed = (k_pos[None, :] <= q_pos[:, None])[None, None]
    if spec.reach:
        band = ((q_pos[:, None] - k_pos[None, :]).abs() <= spec.reach)[None, None]
        allowed = band if allowed is None else allowed & band
    if spec.key_padding is not None:
        pad = spec.key_padding.index_select(1, k_pos)[:, None, None, :]
        allowed = pad if allowed is None else allowed & pad
    return allowed


def _scores(q: Tensor, k: Tensor, spec: RingSpec, block: _Block) -> Tensor:
    """Scaled scores of the block's computed part in float32, -inf where masked."""
    q, k = q[..., block.rows :, :], k[..., : block.cols, :]
    scores = torch.matmul(q, k.transpose(-1, -2)).float().mul_(spec.scale)
    allowed = _allowed(spec, block)
    return scores if allowed is None else scores.masked_fill_(~allowed, float("-inf"))


def _keep(spec: RingSpec, block: _Block) -> Tensor | None:
    keep = spec.keep(block.src)
    return None if keep is None else keep[..., block.rows :, : block.cols]


def _finite(lse: Tensor) -> Tensor:
    """lse with -inf (rows that attend to nothing) as 0, so exp(-inf - lse) stays 0."""
    return torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse))


def _block_forward(
    q: Tensor, k: Tensor, v: Tensor, spec: RingSpec, block: _Block
) -> tuple[Tensor, Tensor]:
    """(output of the block's rows [b, h, n - rows, d] float32 normalized within the block,
    their lse [b, h, n - rows])."""
    scores = _scores(q, k, spec, block)
    lse = torch.logsumexp(scores, dim=-1)
    probs = torch.exp(scores - _finite(lse)[..., None])
    keep = _keep(spec, block)
    if keep is not None:
        probs = probs * keep
    return torch.matmul(probs.to(v.dtype), v[..., : block.cols, :]).float(), lse


def _merge(out: Tensor, lse: Tensor, block: Tensor, block_lse: Tensor) -> tuple[Tensor, Tensor]:
    """The log-sum-exp merge of a block's partial result into the running one."""
    merged = torch.logaddexp(lse, block_lse)
    safe = _finite(merged)
    out = out * torch.exp(lse - safe)[..., None] + block * torch.exp(block_lse - safe)[..., None]
    return out, merged


class RingAttention(torch.autograd.Function):
    """softmax(q k^T * scale + mask) [dropout] @ v over the ring; q, k, v: [b, h, n, d]."""

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, spec: RingSpec) -> Tensor:
        cp, n = spec.cp, q.shape[-2]
        kv = torch.stack([k, v])
        out = lse = None
        for step in range(cp.size):
            block = _Block.of(spec, n, (cp.rank - step) % cp.size)
            pending = ring_shift_async(kv, cp, tag=KV_TAG) if step + 1 < cp.size else None
            if out is None or lse is None:  # step 0: this rank's own block, whole
                out, lse = _block_forward(q, kv[0], kv[1], spec, block)
            elif not block.skipped:
                part, part_lse = _block_forward(q, kv[0], kv[1], spec, block)
                rows = slice(block.rows, None)
                out[..., rows, :], lse[..., rows] = _merge(
                    out[..., rows, :], lse[..., rows], part, part_lse
                )
            if pending is not None:
                kv = pending.wait()
        assert out is not None and lse is not None
        result = out.to(q.dtype)
        ctx.save_for_backward(q, k, v, result, lse, *spec.held)
        ctx.spec = spec
        return result

    @staticmethod
    def backward(ctx, grad_out: Tensor) -> tuple[Tensor, Tensor, Tensor, None]:
        q, k, v, out, lse = ctx.saved_tensors[:5]
        spec: RingSpec = ctx.spec
        cp, n = spec.cp, q.shape[-2]
        grad_out = grad_out.contiguous()
        delta = (grad_out.float() * out.float()).sum(-1, keepdim=True)  # rowsum(dO * O)
        finite = _finite(lse)[..., None]
        grad_q = torch.zeros_like(q, dtype=torch.float32)
        kv = torch.stack([k, v])
        pending_grads = None
        for step in range(cp.size):
            block = _Block.of(spec, n, (cp.rank - step) % cp.size)
            pending_kv = ring_shift_async(kv, cp, tag=KV_TAG) if step + 1 < cp.size else None
            grads = torch.zeros_like(kv, dtype=torch.float32)
            if not block.skipped:
                _block_backward(q, kv, grad_out, spec, block, (finite, delta, grad_q), grads)
            if pending_grads is not None:  # the earlier holders' parts of src's gradients
                grads += pending_grads.wait()
            pending_grads = ring_shift_async(grads, cp, tag=GRAD_TAG)  # on to src's next holder
            if pending_kv is not None:
                kv = pending_kv.wait()
        assert pending_grads is not None
        own = pending_grads.wait()  # the last hop brings this rank's own keys' gradients home
        return grad_q.to(q.dtype), own[0].to(k.dtype), own[1].to(v.dtype), None


def _block_backward(
    q: Tensor,
    kv: Tensor,
    grad_out: Tensor,
    spec: RingSpec,
    block: _Block,
    rowwise: tuple[Tensor, Tensor, Tensor],
    grads: Tensor,
) -> None:
    """One block's backward: its part of grad_q added in place, src's key and value gradients
    written into `grads` [2, b, h, n, d] (rowwise: the forward's finite lse, rowsum(dO * O) and
    grad_q, each [b, h, n, ...])."""
    finite, delta, grad_q = rowwise
    rows, cols = slice(block.rows, None), slice(None, block.cols)
    k_j, v_j = kv[0, ..., cols, :], kv[1, ..., cols, :]
    q_i, grad_out_i = q[..., rows, :], grad_out[..., rows, :]
    probs = torch.exp(_scores(q, kv[0], spec, block) - finite[..., rows, :])
    keep = _keep(spec, block)
    dropped = probs if keep is None else probs * keep
    grad_v = torch.matmul(dropped.to(grad_out.dtype).transpose(-1, -2), grad_out_i)
    grad_dropped = torch.matmul(grad_out_i, v_j.transpose(-1, -2)).float()
    grad_probs = grad_dropped if keep is None else grad_dropped * keep
    grad_scores = probs * (grad_probs - delta[..., rows, :]) * spec.scale
    grad_q[..., rows, :] += torch.matmul(grad_scores.to(k_j.dtype), k_j).float()
    grad_k = torch.matmul(grad_scores.to(q.dtype).transpose(-1, -2), q_i)
    grads[0, ..., cols, :], grads[1, ..., cols, :] = grad_k, grad_v


def ring_attention(q: Tensor, k: Tensor, v: Tensor, spec: RingSpec) -> Tensor:
    """The attention of this rank's queries over the whole sequence: [b, h, n, d]."""
    return RingAttention.apply(q, k, v, spec)
