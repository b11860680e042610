"""Pipeline schedules as plain data: per stage, the ordered forward/backward actions of one step.

A schedule is a pure function of (stages p, micro-batches m[, virtual stages v]); the runner
executes a stage's list with blocking receives and non-blocking sends, and `simulate`
(parallel/pipeline/simulate.py) replays all lists under the same rules to prove a schedule
cannot deadlock and to compute its bubble.

gpipe             all forwards, then all backwards (AFAB): activations of all m micro-batches
                  are alive at once.
1f1b              p - r - 1 warm-up forwards on stage r, then one forward / one backward, then
                  the remaining backwards: at most p - r micro-batches alive (PipeDream-Flush).
interleaved_1f1b  each stage holds v model chunks (virtual stage c x p + r); micro-batches go
                  through in groups of p, chunk by chunk (Megatron's order): the bubble shrinks
                  by v at the price of v x more activation messages.
pipedream         PipeDream's asynchronous 1F1B: the 1F1B order of one endless stream of
                  micro-batches, never flushed; a step is the slice from its first forward to
                  the next step's, so a stage carries p - r - 1 micro-batches' backwards into
                  the next step, and each stage updates its weights after its own backwards
                  (`pipedream_version`: the weight version each forward sees). A drain (before a
                  checkpoint and at the end) runs the carried backwards.
"""

from __future__ import annotations

from dataclasses import dataclass

SCHEDULES = ("gpipe", "1f1b", "interleaved_1f1b", "pipedream")


@dataclass(frozen=True)
class Action:
    """Forward ("F") or backward ("B") of micro-batch `micro` through this stage's `chunk`."""

    kind: str
    micro: int
    chunk: int = 0

    def __repr__(self) -> str:
        return f"{self.kind}{self.micro}" + (f".{self.chunk}" if self.chunk else "")


def virtual_stage(chunk: int, stage: int, stages: int) -> int:
    """Position in the model of a stage's chunk: chunk c of stage r runs virtual stage c*p + r."""
    return chunk * stages + stage


def gpipe(stages: int, micro: int, stage: int) -> list[Action]:
    return [Action("F", i) for i in range(micro)] + [Action("B", i) for i in range(micro)]


def one_f_one_b(stages: int, micro: int, stage: int) -> list[Action]:
    warmup = min(stages - stage - 1, micro)
    actions = [Action("F", i) for i in range(warmup)]
    for i in range(micro - warmup):
        actions += [Action("F", warmup + i), Action("B", i)]
    return actions + [Action("B", i) for i in range(micro - warmup, micro)]


def interleaved(stages: int, micro: int, stage: int, chunks: int) -> list[Action]:
    """Megatron's interleaved 1F1B; needs micro a multiple of stages."""
    if micro % stages:
        raise ValueError(
            f"interleaved_1f1b needs the micro-batches per step ({micro}) to be a "
            f"multiple of parallel.pipeline={stages}"
        )
    total = micro * chunks

    def unit(k: int, backward: bool) -> Action:
        in_group = k % (stages * chunks)
        chunk = in_group // stages
        mb = (k // (stages * chunks)) * stages + k % stages
        return Action("B" if backward else "F", mb, chunks - 1 - chunk if backward else chunk)

    warmup = min((stages - stage - 1) * 2 + (chunks - 1) * stages, total)
    actions = [unit(k, False) for k in range(warmup)]
    for k in range(total - warmup):
        actions += [unit(warmup + k, False), unit(k, True)]
    return actions + [unit(k, True) for k in range(total - warmup, total)]


def pipedream_warmup(stages: int, stage: int, replicas: tuple[int, ...] = ()) -> int:
    """Forwards a worker of `stage` runs before its first backward: p - r - 1; with replicated
    stages PipeDream's NOAM, ceil(workers of stages r.. / replicas[r]) - 1 of its own."""
    if not replicas:
        return stages - stage - 1
    return -(-sum(replicas[stage:]) // replicas[stage]) - 1


def _endless_1f1b(warmup: int, forwards: int) -> list[Action]:
    """The 1F1B order of a stream of micro-batches 0, 1, ... cut before forward `forwards`."""
    actions = [Action("F", i) for i in range(min(warmup, forwards))]
    for i in range(warmup, forwards):
        actions += [Action("F", i), Action("B", i - warmup)]
    return actions


def _replica_stream(
    stages: int, micro: int, stage: int, replicas: tuple[int, ...], replica: int
) -> tuple[int, int, int]:
    """(workers n of the stage, its micro-batches per step m / n, warm-up) of one replica,
    whose local micro-batch l is the stream's l x n + replica."""
    n = replicas[stage] if replicas else 1
    if micro % n:
        raise ValueError(
            f"stage {stage} has {n} replicas but a step has {micro} micro-batches; "
            "trainer.grad_accum must be a multiple of every stage's replica count"
        )
    if not 0 <= replica < n:
        raise ValueError(f"stage {stage} has {n} replicas, no replica {replica}")
    return n, micro // n, pipedream_warmup(stages, stage, replicas)


def _numbered(actions: list[Action], n: int, replica: int) -> list[Action]:
    return [Action(a.kind, a.micro * n + replica) for a in actions]


def pipedream_step(
    stages: int,
    micro: int,
    stage: int,
    step: int,
    replicas: tuple[int, ...] = (),
    replica: int = 0,
) -> list[Action]:
    """Step `step` (counted from the last drain) of the asynchronous schedule: the stream's
    actions from forward step x m to forward (step + 1) x m; micro-batch numbers count the
    stream (micro-batch j of step t is t x m + j), backwards included from earlier steps.
    With `replicas`, the actions of replica `replica` of the stage: every n-th micro-batch."""
    n, local, warmup = _replica_stream(stages, micro, stage, replicas, replica)
    before = len(_endless_1f1b(warmup, step * local))
    return _numbered(_endless_1f1b(warmup, (step + 1) * local)[before:], n, replica)


def pipedream_drain(
    stages: int,
    micro: int,
    stage: int,
    steps: int,
    replicas: tuple[int, ...] = (),
    replica: int = 0,
) -> list[Action]:
    """The backwards still owed after `steps` steps: the last forwards' (in order)."""
    n, local, warmup = _replica_stream(stages, micro, stage, replicas, replica)
    forwards = steps * local
    done = sum(a.kind == "B" for a in _endless_1f1b(warmup, forwards))
    return _numbered([Action("B", i) for i in range(done, forwards)], n, replica)


def replica_backwards_per_update(micro: int, workers: int, *, every_step: bool) -> int:
    """A replica's own backwards per update of its stage: the step's micro-batches / workers
    when updating per step, else one (the stage's `workers` replicas update together)."""
    return micro // workers if every_step else 1


def pipedream_version(
    stages: int,
    stage: int,
    index: int,
    *,
    every: int,
    vertical_sync: bool,
    replicas: tuple[int, ...] = (),
) -> int:
    """The weight version (updates applied since the last drain) the forward of stream
    micro-batch `index` uses on `stage`: the stage's own updates after its backwards before
    that forward, floor(max(0, index - (p - r - 1)) / every); with vertical sync, the version
    the first stage used for that micro-batch (floor(max(0, index - (p - 1)) / every)).
    With `replicas`, in the replica's own numbering: index // n for the micro-batch, `every`
    of its own backwards per update (the replicas update together: an update's micro-batches
    are every x n consecutive ones of the stream)."""
    n = replicas[stage] if replicas else 1
    warmup = pipedream_warmup(stages, 0 if vertical_sync else stage, replicas)
    return max(0, index // n - warmup) // every


def pipedream_stash_counts(
    stages: int, stage: int, micro: int, steps: int, *, every: int, vertical_sync: bool
) -> list[tuple[Action, int]]:
    """Stage `stage`'s actions over its first `steps` steps of the asynchronous schedule, each
    with the weight versions PipeDreamRunner holds stashed when it runs (a backward: when its
    autograd backward is called). The runner's bookkeeping without tensors: a forward keeps
    the version it reads; after `every` backwards an update stashes the live version if a coming
    forward still reads it; a version is dropped once no micro-batch in flight and no coming
    forward reads it."""

    def version(index: int) -> int:
        return pipedream_version(stages, stage, index, every=every, vertical_sync=vertical_sync)

    held: set[int] = set()
    in_flight: dict[int, int] = {}
    forwards = updates = 0

    def tidy() -> None:
        coming = version(forwards)
        held.intersection_update({*in_flight.values(), *(v for v in held if v >= coming)})

    out = []
    for step in range(steps):
        for action in pipedream_step(stages, micro, stage, step):
            if action.kind == "F":
                in_flight[action.micro] = version(action.micro)
                held.add(in_flight[action.micro])
                out.append((action, len(held)))
                forwards += 1
            else:
                out.append((action, len(held)))
                in_flight.pop(action.micro)
                if (action.micro + 1) % every == 0:
                    if version(forwards) <= updates:
                        held.add(updates)
                    updates += 1
            tidy()
    return out


def actions_for(
    name: str, stages: int, micro: int, stage: int, chunks: int = 1, *, train: bool = True
) -> list[Action]:
    """Stage `stage`'s actions for one step; forward-only (evaluation) keeps the forwards."""
    if name == "gpipe":
        actions = gpipe(stages, micro, stage)
    elif name == "pipedream":  # one step from an empty pipeline, drained (evaluation: forwards)
        actions = pipedream_step(stages, micro, stage, 0) + pipedream_drain(stages, micro, stage, 1)
    elif name == "1f1b":
        actions = one_f_one_b(stages, micro, stage)
    elif name == "interleaved_1f1b":
        actions = interleaved(stages, micro, stage, chunks)
    else:
        raise ValueError(f"unknown pipeline schedule {name!r}; valid: {list(SCHEDULES)}")
    return actions if train else [a for a in actions if a.kind == "F"]
