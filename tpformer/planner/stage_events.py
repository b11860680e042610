"""A pipeline stage's schedule as the planner walks it: (forward?, virtual stage, weight versions
stashed) per action. The search prices thousands of layouts that share a few schedules, so each
(schedule, stages, micro-batches, stage, chunks) is walked once and kept."""

from __future__ import annotations

import functools

from tpformer.parallel.pipeline.schedule import (
    Action,
    actions_for,
    pipedream_stash_counts,
    virtual_stage,
)
from tpformer.planner.candidate import Candidate, Workload

Events = tuple[tuple[bool, int, int], ...]


def stage_events(work: Workload, c: Candidate, stage: int) -> Events:
    """The stage's actions as (forward?, virtual stage, weight versions stashed when it runs).
    PipeDream's stream carries micro-batches over from step to step: its steps are walked until
    the stream is full (p - r in flight), past its first steps from an empty pipeline."""
    if c.schedule != "pipedream":
        return _schedule_events(c.schedule, c.pp, c.grad_accum, stage, c.chunks)
    every = c.grad_accum if work.pipedream_every_step else 1
    steps = 2 + -(-c.pp // c.grad_accum)
    return _pipedream_events(c.pp, stage, c.grad_accum, steps, every, work.pipedream_vertical_sync)


@functools.lru_cache(maxsize=4096)
def _schedule_events(schedule: str, pp: int, micro: int, stage: int, chunks: int) -> Events:
    return _as_events([(a, 0) for a in actions_for(schedule, pp, micro, stage, chunks)], stage, pp)


@functools.lru_cache(maxsize=4096)
def _pipedream_events(
    pp: int, stage: int, micro: int, steps: int, every: int, vertical_sync: bool
) -> Events:
    walk = pipedream_stash_counts(pp, stage, micro, steps, every=every, vertical_sync=vertical_sync)
    return _as_events(walk, stage, pp)


def _as_events(walk: list[tuple[Action, int]], stage: int, pp: int) -> Events:
    return tuple(
        (a.kind == "F", virtual_stage(a.chunk, stage, pp), versions) for a, versions in walk
    )
