"""The search: every valid layout of a workload on a cluster, its predicted memory and time,
the ones that fit ranked by step time, and for the rest why they lose."""

from __future__ import annotations

import functools
from dataclasses import dataclass

from tpformer.config.families import family_of
from tpformer.parallel.layout import divisors
from tpformer.planner.candidate import Candidate, Workload, enumerate_candidates, tensor_degrees
from tpformer.planner.cluster import Cluster
from tpformer.planner.memory import MemoryPrediction, predict_memory
from tpformer.planner.step_time import TimePrediction, predict_time

GB = 1e9
MODEL_ERROR = 0.10
"""The step-time model's error as stated (predicted against published large-model runs: within
about 10%): layouts predicted within it of the fastest are tied, and ranked by simplicity."""


@dataclass(frozen=True)
class Evaluated:
    candidate: Candidate
    memory: MemoryPrediction
    time: TimePrediction | None
    """None when the layout does not fit (its time is not computed)."""

    @property
    def fits(self) -> bool:
        return self.time is not None


@dataclass(frozen=True)
class PlanResult:
    work: Workload
    cluster: Cluster
    ranked: list[Evaluated]
    """Layouts that fit: those tied with the fastest (within MODEL_ERROR) first, simplest
    first, then the rest, fastest first."""
    evaluated: list[Evaluated]
    """Every layout searched."""

    @property
    def best(self) -> Evaluated:
        return self.ranked[0]

    @functools.cached_property  # `tied` asks it of every ranked layout
    def fastest(self) -> float:
        """The fastest predicted step (seconds)."""
        return min(e.time.step for e in self.ranked)  # type: ignore[union-attr]

    def tied(self, e: Evaluated) -> bool:
        return e.time is not None and e.time.step <= self.fastest * (1 + MODEL_ERROR)


def host_fits(memory: MemoryPrediction, cluster: Cluster) -> bool:
    """Offloaded state of every rank of a node fits its host RAM (when the cluster names it)."""
    return not cluster.host_memory or memory.host * cluster.gpus_per_node <= cluster.host_memory


def evaluate(work: Workload, c: Candidate, cluster: Cluster) -> Evaluated:
    memory = predict_memory(work, c, cluster)
    fits = memory.total <= cluster.device_memory and host_fits(memory, cluster)
    return Evaluated(c, memory, predict_time(work, c, cluster) if fits else None)


def rank_key(e: Evaluated) -> tuple:
    """Fastest first; at equal predicted time the simpler layout (lower ZeRO stage, no
    offload, less recomputation: what the model does not price, such as hook overheads),
    then the one with more memory to spare."""
    return (round(e.time.step, 12), *_memory_savers(e.candidate), e.memory.total)  # type: ignore[union-attr]


def _memory_savers(c: Candidate) -> tuple[int, bool, int]:
    """What the model prices least surely, lowest first: ZeRO stage, offload, recomputation."""
    return c.zero_stage, c.cpu_offload != "none", ["none", "selective", "full"].index(c.recompute)


def simplicity_key(e: Evaluated) -> tuple:
    """Among tied layouts: the lower ZeRO stage, no offload, less recomputation, fewer
    pipeline stages (what the model prices least surely), then the faster."""
    return (*_memory_savers(e.candidate), e.candidate.pp, *rank_key(e))


def tie_ranked(fitting: list[Evaluated]) -> list[Evaluated]:
    """The layouts within MODEL_ERROR of the fastest, simplest first; then the rest by time."""
    by_time = sorted(fitting, key=rank_key)
    limit = by_time[0].time.step * (1 + MODEL_ERROR)  # type: ignore[union-attr]
    tied = [e for e in by_time if e.time.step <= limit]  # type: ignore[union-attr]
    return sorted(tied, key=simplicity_key) + by_time[len(tied) :]


def distinct_splits(ranked: list[Evaluated], count: int) -> list[Evaluated]:
    """The first layout of each tensor x pipeline split, in ranked order, up to `count`: what
    confirmation runs compare (not one split at three ZeRO stages)."""
    seen: set[tuple[int, int]] = set()
    out = []
    for e in ranked:
        split = (e.candidate.tp, e.candidate.pp)
        if split not in seen:
            seen.add(split)
            out.append(e)
        if len(out) == count:
            break
    return out


def _no_layout_message(work: Workload, cluster: Cluster) -> str:
    world = cluster.world_size
    degrees = tensor_degrees(work.model, cluster.gpus_per_node)
    dps = sorted(
        {
            world // (t * p)
            for t in degrees
            if world % t == 0
            for p in divisors(world // t)
            if p <= work.model.num_layers
        }
    )
    return (
        f"no layout can form the global batch of {work.global_batch} on {world} devices: "
        f"it must be divisible by a data-parallel degree in {dps} (tensor degrees "
        f"{degrees} divide model.num_heads={work.model.num_heads} and "
        f"cluster.gpus_per_node={cluster.gpus_per_node}); e.g. plan.global_batch="
        f"{-(-work.global_batch // dps[-1]) * dps[-1] if dps else world}"
    )


def search(
    work: Workload, cluster: Cluster, *, max_micro_batch: int = 64, device_type: str = "cuda"
) -> PlanResult:
    """Rank every layout of `work` on `cluster`; ValueError when none exists or none fits."""
    evaluated = [
        evaluate(work, c, cluster)
        for c in enumerate_candidates(
            work,
            cluster.world_size,
            cluster.gpus_per_node,
            max_micro_batch=max_micro_batch,
            device_type=device_type,
        )
    ]
    if not evaluated:
        raise ValueError(_no_layout_message(work, cluster))
    fitting = [e for e in evaluated if e.fits]
    if not fitting:
        smallest = min(evaluated, key=lambda e: e.memory.total)
        c = smallest.candidate
        raise ValueError(
            f"{work.name or family_of(work.model).name} ({work.model.num_layers} layers, hidden "
            f"{work.model.hidden_size}) "
            f"needs {smallest.memory.total / GB:.1f} GB per rank at the smallest layout "
            f"({c.label()}, global batch {work.global_batch}, seq {work.seq}); the device has "
            f"{cluster.device_memory / GB:.1f} GB (cluster.device_memory_gb): add devices "
            f"(cluster.nodes), shorten data.seq_length or lower the global batch"
        )
    return PlanResult(work, cluster, tie_ranked(fitting), evaluated)


def why_not(result: PlanResult, e: Evaluated) -> str:
    """One line: how a layout loses against the best."""
    cluster = result.cluster
    if not e.fits and not host_fits(e.memory, cluster):
        return (
            f"does not fit the host: {cluster.gpus_per_node} x {e.memory.host / GB:.1f} GB "
            f"offloaded > {cluster.host_memory / GB:.0f} GB of RAM per node"
        )
    if not e.fits:
        return f"does not fit: {e.memory.total / GB:.1f} GB > {cluster.device_memory / GB:.1f} GB"
    if result.tied(e):
        return f"tied (within the model's {MODEL_ERROR:.0%})"
    return f"slower by {(e.time.step / result.fastest - 1):.1%}"  # type: ignore[union-attr]


def best_per_family(result: PlanResult) -> dict[tuple[int, int, int], Evaluated]:
    """The best layout of each tensor x pipeline x context degree: its first in the ranking,
    else (none fits) the one needing the least memory."""
    families: dict[tuple[int, int, int], Evaluated] = {}

    def family(e: Evaluated) -> tuple[int, int, int]:
        return e.candidate.tp, e.candidate.pp, e.candidate.cp

    for e in result.ranked:
        families.setdefault(family(e), e)
    for e in sorted(result.evaluated, key=lambda e: e.memory.total):
        families.setdefault(family(e), e)
    return families
