"""Cross-entropy over vocabulary-sharded logits, never gathered.

Forward issues exactly three all-reduces of target-sized fp32 tensors (the row max, the target
logit [stacked with the logit sum when label smoothing is on], the sum of exponentials);
backward is local.
"""

from __future__ import annotations

import torch
from torch import Tensor

from tpformer.parallel.comm import ReduceOp, all_reduce
from tpformer.parallel.handle import GroupHandle


class _VocabParallelCrossEntropy(torch.autograd.Function):
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
        logits = logits.float()  # [N, V/tp]
        per_rank = logits.shape[-1]
        start = tp.rank * per_rank
        valid = max(0, min(per_rank, vocab_size - start))  # columns that are real tokens
        real = logits[:, :valid]  # a view: padding columns get no probability

        if valid:
            row_max = real.max(dim=-1).values
        else:  # every column of this rank pads the vocabulary
            row_max = logits.new_full(logits.shape[:1], float("-inf"))
        all_reduce(row_max, tp, ReduceOp.MAX)  # 1

        # logits - max written once into the buffer that becomes exp(.) and, in backward, the
        # gradient (no clone of the padded logits, no second [N, V/tp] tensor)
        probs = torch.empty_like(logits)
        torch.sub(real, row_max.unsqueeze(-1), out=probs[:, :valid])
        probs[:, valid:].zero_()

        ignored = target == ignore_index
        local_target = target - start
        outside = (local_target < 0) | (local_target >= valid) | ignored
        local_target = local_target.masked_fill(outside, 0)
        target_logit = probs.gather(-1, local_target.unsqueeze(-1)).squeeze(-1)
        target_logit = target_logit.masked_fill(outside, 0.0)
        if smoothing > 0:
            stats = torch.stack([target_logit, probs[:, :valid].sum(dim=-1)])
            all_reduce(stats, tp)  # 2
            target_logit, logit_sum = stats[0], stats[1]
        else:
            all_reduce(target_logit, tp)  # 2

        probs[:, :valid].exp_()
        sum_exp = probs.sum(dim=-1)
        all_reduce(sum_exp, tp)  # 3
        log_z = sum_exp.log()
        loss = log_z - target_logit
        if smoothing > 0:
            loss = (1.0 - smoothing) * loss + smoothing * (log_z - logit_sum / vocab_size)
        loss = loss.masked_fill(ignored, 0.0)

        probs.div_(sum_exp.unsqueeze(-1))
        ctx.save_for_backward(probs, local_target, outside, ignored)
        ctx.smoothing, ctx.valid, ctx.vocab_size = smoothing, valid, vocab_size
        # the target's shifted logit is exactly 0 where it is the global row max: a hit, known
        # on every rank without another collective (ties count as hits)
        correct = (target_logit == 0.0) & ~ignored
        ctx.mark_non_differentiable(correct)
        return loss, correct

    @staticmethod
    def backward(ctx, grad_loss: Tensor, grad_correct: Tensor | None = None):
        probs, local_target, outside, ignored = ctx.saved_tensors
        grad = probs  # softmax, reused in place
        hit = (~outside).to(grad.dtype)
        grad.scatter_add_(
            -1, local_target.unsqueeze(-1), -(1.0 - ctx.smoothing) * hit.unsqueeze(-1)
        )
        if ctx.smoothing > 0:
            grad[:, : ctx.valid] -= ctx.smoothing / ctx.vocab_size
        scale = grad_loss.masked_fill(ignored, 0.0).unsqueeze(-1)
        grad.mul_(scale)
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
