"""Cross-entropy over vocabulary-sharded logits, never gathered, never upcast whole.

Forward issues exactly three all-reduces of target-sized fp32 tensors (the row max, the target
logit [stacked with the logit sum when label smoothing is on], the sum of exponentials);
backward is local, recomputing the softmax a chunk of rows at a time.
"""

from __future__ import annotations

import torch
from torch import Tensor

from tpformer.parallel.comm import ReduceOp, all_reduce
from tpformer.parallel.handle import GroupHandle

CHUNK_ELEMENTS = 1 << 24
"""Logits upcast to fp32 at a time (64 MB): a chunk of rows, never the whole [N, V/tp] (a
Llama-3 head at 8k tokens takes 63 chunks of a few kernels each)."""


def row_chunks(rows: int, columns: int) -> list[slice]:
    """Slices of `rows` with about CHUNK_ELEMENTS logits each (at least one row per chunk)."""
    step = max(1, CHUNK_ELEMENTS // max(1, columns))
    return [slice(i, min(rows, i + step)) for i in range(0, rows, step)]


class _VocabParallelCrossEntropy(torch.autograd.Function):
    """Keeps the logits in their own dtype (bf16 under mixed precision) and upcasts a chunk of
    rows at a time (`row_chunks`), in forward for the sums and in backward for the softmax it
    recomputes: no fp32 [N, V/tp] tensor lives (Megatron's and torchtitan's loss keep one; a
    Llama-3-8B-shaped head at 8k tokens and TP=1 would hold 4 GB each)."""

    @staticmethod
    def forward(
        ctx,
        logits: Tensor,
        target: Tensor,
        tp: GroupHandle,
        vocab_size: int,
        ignore_index: int,
        smoothing: float,
    ) -> tuple[Tensor, Tensor]:
        per_rank = logits.shape[-1]  # [N, V/tp]
        start = tp.rank * per_rank
        valid = max(0, min(per_rank, vocab_size - start))  # columns that are real tokens
        real = logits[:, :valid]  # a view: padding columns get no probability

        if valid:  # the max is exact in the logits' dtype
            row_max = real.max(dim=-1).values.float()
        else:  # every column of this rank pads the vocabulary
            row_max = logits.new_full(logits.shape[:1], float("-inf"), dtype=torch.float32)
        all_reduce(row_max, tp, ReduceOp.MAX)  # 1

        ignored = target == ignore_index
        local_target = target - start
        outside = (local_target < 0) | (local_target >= valid) | ignored
        local_target = local_target.masked_fill(outside, 0)
        target_logit = logits.gather(-1, local_target.unsqueeze(-1)).squeeze(-1).float()
        target_logit = (target_logit - row_max).masked_fill(outside, 0.0)
        sum_exp = torch.zeros_like(row_max)
        logit_sum = torch.zeros_like(row_max)
        for rows in row_chunks(logits.shape[0], valid):
            shifted = real[rows] - row_max[rows].unsqueeze(-1)  # fp32: one allocation
            if smoothing > 0:
                logit_sum[rows] = shifted.sum(dim=-1)
            sum_exp[rows] = shifted.exp_().sum(dim=-1)
        if smoothing > 0:
            stats = torch.stack([target_logit, logit_sum])
            all_reduce(stats, tp)  # 2
            target_logit, logit_sum = stats[0], stats[1]
        else:
            all_reduce(target_logit, tp)  # 2
        all_reduce(sum_exp, tp)  # 3
        log_z = sum_exp.log()
        loss = log_z - target_logit
        if smoothing > 0:
            loss = (1.0 - smoothing) * loss + smoothing * (log_z - logit_sum / vocab_size)
        loss = loss.masked_fill(ignored, 0.0)

        ctx.save_for_backward(logits, row_max, sum_exp, local_target, outside, ignored)
        ctx.smoothing, ctx.valid, ctx.vocab_size = smoothing, valid, vocab_size
        # the target's shifted logit is exactly 0 where it is the global row max: a hit, known
        # on every rank without another collective (ties count as hits)
        correct = (target_logit == 0.0) & ~ignored
        ctx.mark_non_differentiable(correct)
        return loss, correct

    @staticmethod
    def backward(ctx, grad_loss: Tensor, grad_correct: Tensor | None = None):
        logits, row_max, sum_exp, local_target, outside, ignored = ctx.saved_tensors
        valid, smoothing = ctx.valid, ctx.smoothing
        grad = torch.zeros_like(logits)  # the padding columns' stay 0
        hit = (~outside).float().unsqueeze(-1) * -(1.0 - smoothing)
        scale = grad_loss.float().masked_fill(ignored, 0.0).unsqueeze(-1)
        for rows in row_chunks(logits.shape[0], valid) if valid else []:
            probs = (logits[rows, :valid] - row_max[rows].unsqueeze(-1)).exp_()
            probs.div_(sum_exp[rows].unsqueeze(-1))  # the softmax, recomputed
            probs.scatter_add_(-1, local_target[rows].unsqueeze(-1), hit[rows])
            if smoothing > 0:
                probs -= smoothing / ctx.vocab_size
            grad[rows, :valid] = probs.mul_(scale[rows])
        return grad, None, None, None, None, None


def vocab_parallel_cross_entropy(
    logits: Tensor,
    target: Tensor,
    tp: GroupHandle,
    *,
    vocab_size: int,
    ignore_index: int = -100,
    label_smoothing: float = 0.0,
) -> Tensor:
    """Per-token loss [N] from this rank's logits [N, V_padded/tp] and global targets [N].

    Matches F.cross_entropy(full_logits[:, :vocab_size], target, reduction="none",
    ignore_index=..., label_smoothing=...) on the gathered logits. Ignored rows give 0.
    """
    return vocab_parallel_cross_entropy_and_hits(
        logits,
        target,
        tp,
        vocab_size=vocab_size,
        ignore_index=ignore_index,
        label_smoothing=label_smoothing,
    )[0]


def vocab_parallel_cross_entropy_and_hits(
    logits: Tensor,
    target: Tensor,
    tp: GroupHandle,
    *,
    vocab_size: int,
    ignore_index: int = -100,
    label_smoothing: float = 0.0,
) -> tuple[Tensor, Tensor]:
    """(per-token loss [N], bool [N] whether the target is the argmax of the full logits), with
    the same three all-reduces as the loss alone: accuracy comes free."""
    if logits.dim() != 2 or target.shape != logits.shape[:1]:
        raise ValueError(
            f"expected logits [N, V/tp] and target [N], got {tuple(logits.shape)} "
            f"and {tuple(target.shape)}"
        )
    if not 0.0 <= label_smoothing < 1.0:
        raise ValueError(f"label_smoothing={label_smoothing} must be in [0, 1)")
    if logits.shape[-1] * tp.size < vocab_size:
        raise ValueError(
            f"logits cover {logits.shape[-1] * tp.size} tokens across tp={tp.size}, "
            f"fewer than vocab_size={vocab_size}"
        )
    return _VocabParallelCrossEntropy.apply(
        logits, target, tp, vocab_size, ignore_index, label_smoothing
    )
