"""Which global samples a rank's micro-batch holds: a function of (step, layout) only.

The global batch of step s is samples [s * G, (s + 1) * G); DP rank r takes the contiguous
slice [r * G / dp, (r + 1) * G / dp) and splits it into `accum` micro-batches. TP ranks of one
replica therefore see the same micro-batches, and any (dp, micro-batch, accumulation) with the
same G trains on the same samples per step.
"""

from __future__ import annotations


def micro_batch_ranges(
    step: int, *, micro_batch_size: int, grad_accum: int, dp_size: int, dp_rank: int
) -> list[range]:
    """Global sample indices of each micro-batch of this DP rank at `step`."""
    per_rank = micro_batch_size * grad_accum
    first = step * per_rank * dp_size + dp_rank * per_rank
    return [
        range(first + m * micro_batch_size, first + (m + 1) * micro_batch_size)
        for m in range(grad_accum)
    ]
