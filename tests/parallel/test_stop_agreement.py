"""The loop's stop agreement (parallel/control.py): one step late on several ranks, the same on
every rank, nothing left in flight after settle(); at once in one process."""

from __future__ import annotations

from tests.dist import run_distributed
from tpformer.parallel.context import ParallelContext
from tpformer.parallel.control import StopAgreement


def _steps(ctx: ParallelContext) -> list[list[bool]]:
    """Rank 1 raises the first flag at step 2 and keeps it; the second flag is never raised.
    What each step reads, then what settle() returns."""
    agreement = StopAgreement(ctx)
    seen = [agreement.exchange(ctx.rank == 1 and step >= 2, False) for step in range(5)]
    return [*seen, agreement.settle() or []]


def test_a_flag_raised_at_step_k_is_agreed_by_every_rank_at_step_k_plus_1() -> None:
    want = [[False, False]] * 3 + [[True, False]] * 3
    for rank, seen in enumerate(run_distributed(_steps, 2, tensor=1)):
        assert seen == want, (rank, seen)


def test_one_process_agrees_at_once() -> None:
    agreement = StopAgreement(ParallelContext.single(device="cpu"))
    assert agreement.exchange(True, False) == [True, False]
    assert agreement.settle() is None
