"""Pure layout arithmetic: no process groups, no torch.distributed calls.

Everything here is checked before the first collective, so a bad layout fails with a
message that names the values instead of hanging a rank.
"""

from __future__ import annotations

from dataclasses import dataclass


def divisors(n: int) -> list[int]:
    """All positive divisors of n, ascending (used in error messages)."""
    return [d for d in range(1, n + 1) if n % d == 0]


def divide(numerator: int, denominator: int, *, what: str = "value") -> int:
    """numerator // denominator, raising a ValueError that names both when it is not exact."""
    if denominator < 1:
        raise ValueError(f"cannot split {what}={numerator} into {denominator} parts")
    if numerator % denominator != 0:
        raise ValueError(
            f"{what}={numerator} is not divisible by tp={denominator}; "
            f"valid tp degrees for it are {divisors(numerator)}"
        )
    return numerator // denominator


def pad_to_multiple(n: int, multiple: int) -> int:
    """Smallest multiple of `multiple` that is >= n."""
    return -(-n // multiple) * multiple


def shard_range(size: int, parts: int, index: int) -> tuple[int, int]:
    """[start, stop) of chunk `index` when `size` is split into `parts` equal chunks."""
    chunk = divide(size, parts, what="size")
    return index * chunk, (index + 1) * chunk


def check_split(split: list[int], layers: int, parts: int, what: str) -> list[int]:
    """parallel.pipeline_layers, an explicit split: one positive count per stage (or virtual
    stage), summing to `layers`; `what` names the stages in the error."""
    if len(split) != parts:
        raise ValueError(
            f"parallel.pipeline_layers={split} has {len(split)} entries; {what} "
            f"needs {parts} (one per stage)"
        )
    if any(int(n) != n or n < 1 for n in split):
        raise ValueError(f"parallel.pipeline_layers={split}: every stage needs at least one layer")
    if sum(split) != layers:
        raise ValueError(
            f"parallel.pipeline_layers={split} sums to {sum(split)} layers; the model "
            f"has model.num_layers={layers}"
        )
    return [int(n) for n in split]


@dataclass(frozen=True)
class Layout:
    """World = pp x dp x cp x tp; TP ranks are adjacent, CP next, PP outermost
    (global rank = ((pp_rank * dp + dp_rank) * cp + cp_rank) * tp + tp_rank), as in Megatron.

    Adjacent TP ranks keep a TP group inside one node, where the bandwidth is; CP groups come
    next (a ring of point-to-point transfers every layer: inside the node too when cp x tp fits
    one); pipeline stages, which exchange only one activation per micro-batch, are the ones
    that cross nodes.

    `stage_workers` (PipeDream's stage replication, e.g. (2, 1)): stage r runs on stage_workers[r]
    workers, consecutive ranks, each taking every stage_workers[r]-th micro-batch; dp = tp = cp = 1
    and the world is sum(stage_workers). Empty: the regular grid above.
    """

    dp: int
    tp: int
    pp: int = 1
    cp: int = 1
    stage_workers: tuple[int, ...] = ()

    @property
    def world_size(self) -> int:
        if self.stage_workers:
            return sum(self.stage_workers)
        return self.pp * self.dp * self.cp * self.tp

    def _stage_start(self, stage: int) -> int:
        """The first global rank of `stage` in a replicated layout."""
        return sum(self.stage_workers[:stage])

    def replica_of(self, rank: int) -> int:
        """Which of its stage's replicas a global rank is (0 in a regular layout: its DP rank
        is a coordinate of its own)."""
        if not self.stage_workers:
            return 0
        return rank - self._stage_start(self.stage_of(rank))

    def peer(self, stage: int, micro: int) -> int:
        """The rank, in the group the pipeline's messages travel on (ctx.pp), that runs
        micro-batch `micro` on `stage`: the stage itself in a regular layout (ctx.pp is this
        rank's pipeline), replica micro % replicas[stage] of it (ctx.pp is the world)."""
        if not self.stage_workers:
            return stage
        return self._stage_start(stage) + micro % self.stage_workers[stage]

    def rank_of(self, pp: int, dp: int, tp: int, cp: int = 0) -> int:
        return ((pp * self.dp + dp) * self.cp + cp) * self.tp + tp

    def _ranks(self) -> list[tuple[int, int, int, int]]:
        """Every (pp, dp, cp, tp) coordinate, in global rank order (a stage's replicas are its
        DP ranks)."""
        if self.stage_workers:
            return [(p, d, 0, 0) for p, n in enumerate(self.stage_workers) for d in range(n)]
        return [
            (p, d, c, t)
            for p in range(self.pp)
            for d in range(self.dp)
            for c in range(self.cp)
            for t in range(self.tp)
        ]

    def _groups(self, varying: str) -> list[list[int]]:
        """The groups whose members differ only in the coordinates named in `varying` (letters
        of "pdct"), members in rank order, groups in the order of their first member."""
        groups: dict[tuple[int, ...], list[int]] = {}
        for rank, coord in enumerate(self._ranks()):
            key = tuple(x for x, name in zip(coord, "pdct") if name not in varying)
            groups.setdefault(key, []).append(rank)
        return list(groups.values())

    def tp_groups(self) -> list[list[int]]:
        """Global ranks of each TP group (one group per stage, DP replica and CP rank)."""
        return self._groups("t")

    def dp_groups(self) -> list[list[int]]:
        """Global ranks of each DP group (one group per stage, CP rank and TP rank)."""
        return self._groups("d")

    def cp_groups(self) -> list[list[int]]:
        """Global ranks of each CP ring (one per stage, DP replica and TP rank)."""
        return self._groups("c")

    def dp_cp_groups(self) -> list[list[int]]:
        """Global ranks of each DP x CP group: the ranks that hold the same parameters, whose
        gradients the engine sums and whose ZeRO shards it splits them into."""
        return self._groups("dc")

    def pp_groups(self) -> list[list[int]]:
        """Global ranks of each pipeline, stage by stage (one per DP replica, CP and TP rank);
        with replicated stages, one group: the world (a micro-batch's path depends on it)."""
        if self.stage_workers:
            return [list(range(self.world_size))]
        return self._groups("p")

    def coords(self, rank: int) -> tuple[int, int]:
        """(dp_rank, tp_rank) of a global rank."""
        return (rank // (self.cp * self.tp)) % self.dp, rank % self.tp

    def cp_rank_of(self, rank: int) -> int:
        """The CP rank (position in its ring) of a global rank."""
        return (rank // self.tp) % self.cp

    def stage_of(self, rank: int) -> int:
        """The pipeline stage (pp rank) of a global rank."""
        if self.stage_workers:
            return self._ranks()[rank][0]
        return rank // (self.dp * self.cp * self.tp)

    def describe(self) -> str:
        """ "pp1 dp2 cp2 tp2"-style name (cp only when > 1); "pp2 replicas 2-1 tp1" with
        replicated stages."""
        if self.stage_workers:
            return f"pp{self.pp} replicas {'-'.join(map(str, self.stage_workers))} tp{self.tp}"
        cp = f" cp{self.cp}" if self.cp > 1 else ""
        return f"pp{self.pp} dp{self.dp}{cp} tp{self.tp}"


def resolve_layout(
    tensor: int, data: int | str, world_size: int, pipeline: int = 1, context: int = 1
) -> Layout:
    """Turn parallel.tensor / data (int or "auto") / pipeline / context into a Layout for this
    world size."""
    if tensor < 1:
        raise ValueError(f"parallel.tensor={tensor} must be >= 1")
    if pipeline < 1:
        raise ValueError(f"parallel.pipeline={pipeline} must be >= 1")
    if context < 1:
        raise ValueError(f"parallel.context={context} must be >= 1")
    model = tensor * pipeline * context
    factors = (
        f"parallel.tensor={tensor}"
        + (f" x parallel.context={context}" if context > 1 else "")
        + (f" x parallel.pipeline={pipeline}" if pipeline > 1 else "")
    )
    several = pipeline > 1 or context > 1
    if world_size % model != 0:
        what = factors + (f" = {model}" if several else "")
        valid = "valid products are" if several else "valid values are"
        raise ValueError(
            f"{what} does not divide world_size={world_size}; {valid} {divisors(world_size)}"
        )
    if data == "auto":
        return Layout(dp=world_size // model, tp=tensor, pp=pipeline, cp=context)
    if isinstance(data, str):
        if not data.isdigit():
            raise ValueError(f"parallel.data={data!r} must be a positive integer or 'auto'")
        data = int(data)
    if data < 1 or data * model != world_size:
        raise ValueError(
            f"parallel.data={data} x {factors} = {data * model} must equal "
            f"world_size={world_size}; use parallel.data=auto (= {world_size // model})"
        )
    return Layout(dp=data, tp=tensor, pp=pipeline, cp=context)


def replicated_layout(
    replicas: list[int] | tuple[int, ...],
    world_size: int,
    *,
    tensor: int = 1,
    data: int | str = "auto",
    context: int = 1,
    pipeline: int | None = None,
) -> Layout:
    """parallel.pipeline_replicas (workers per stage, PipeDream's "2-1") as a Layout: the
    replicas are a stage's data parallelism, so tensor, context and data stay 1, and the world
    is their sum."""
    counts = tuple(int(n) for n in replicas)
    if len(counts) < 2 or any(n < 1 for n in counts):
        raise ValueError(
            f"parallel.pipeline_replicas={list(replicas)} needs one worker count >= 1 per "
            "pipeline stage, at least two stages"
        )
    if pipeline is not None and pipeline != len(counts):
        raise ValueError(
            f"parallel.pipeline_replicas={list(counts)} names {len(counts)} stages but "
            f"parallel.pipeline={pipeline}; give one worker count per stage"
        )
    if tensor != 1 or context != 1 or str(data) not in ("auto", "1"):
        raise ValueError(
            f"parallel.pipeline_replicas={list(counts)}: replicated stages are the data "
            f"parallelism (each replica takes whole micro-batches); set parallel.tensor=1, "
            f"parallel.context=1 and parallel.data=auto (got tensor={tensor}, "
            f"context={context}, data={data})"
        )
    if sum(counts) != world_size:
        raise ValueError(
            f"parallel.pipeline_replicas={list(counts)} uses {sum(counts)} workers but "
            f"world_size={world_size}; the worker counts must sum to the world size"
        )
    return Layout(dp=1, tp=1, pp=len(counts), stage_workers=counts)


def provisional_replicas(world_size: int, stages: int) -> list[int]:
    """The replicas a parallel.pipeline_split=pipedream run starts with, until its partitioner
    has measured the model and chosen (every rank spare on the first stage)."""
    if world_size < stages:
        raise ValueError(
            f"parallel.pipeline_split=pipedream places parallel.pipeline={stages} stages on "
            f"world_size={world_size} ranks; it needs at least {stages}"
        )
    return [world_size - stages + 1] + [1] * (stages - 1)
