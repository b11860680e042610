"""`parallel.tensor=auto` / `parallel.pipeline=auto`: the planner picks the degrees a run starts
with, for the world it finds. Only the keys set to auto are chosen; every other key (ZeRO stage,
offload, recomputation, precision, micro-batch size, schedule, ...) is the user's, pinned at its
configured value. The choice is a pure function of the config, the world size and the cluster
constants, so every rank derives the same one (ParallelContext.create checks that they did)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from tpformer.config.derive import apply_global_batch
from tpformer.config.schema import Config
from tpformer.config.validate import validate
from tpformer.parallel.layout import divisors, resolve_layout
from tpformer.planner.candidate import Workload, candidate_of
from tpformer.planner.cluster import Cluster, resolve_cluster
from tpformer.planner.search import GB, Evaluated, evaluate, rank_key

AUTO = "auto"


@dataclass(frozen=True)
class AutoLayout:
    """The layout chosen for a run, the runner-up, and what was compared."""

    chosen: Evaluated
    runner_up: Evaluated | None
    compared: int
    """Layouts that are valid for this config and world."""
    cluster: Cluster
    global_batch: int

    def describe(self, keys: list[str]) -> list[str]:
        """The startup plan's lines: what was chosen for `keys`, and the runner-up."""
        first = self.chosen
        lines = [
            f"{auto_label(keys)}: chose {_label(first)} of "
            f"{self.compared} valid layout(s) for world {self.cluster.world_size}, global batch "
            f"{self.global_batch} (predicted on cluster {self.cluster.name}"
            + ("" if first.fits else "; none is predicted to fit: the smallest is taken")
            + ")"
        ]
        second = self.runner_up
        if second is not None:
            lines.append(f"  runner-up: {_label(second)}")
        return lines


def _label(e: Evaluated) -> str:
    c = e.candidate
    time = f", step {e.time.step:.3g} s" if e.time is not None else ""
    return (
        f"tensor={c.tp} pipeline={c.pp} (dp {c.dp}, grad_accum {c.grad_accum}; "
        f"{e.memory.total / GB:.2f} GB per rank{time})"
    )


def auto_keys(config: Config) -> list[str]:
    """The layout keys this config leaves to the planner."""
    p = config.parallel
    return [
        f"parallel.{name}"
        for name, value in (("tensor", p.tensor), ("pipeline", p.pipeline))
        if value == AUTO
    ]


def auto_label(keys: list[str]) -> str:
    """`parallel.tensor=auto and parallel.pipeline=auto`, for messages."""
    return " and ".join(f"{k}=auto" for k in keys)


def check_degree(name: str, value: int | str) -> None:
    """A layout degree is a positive integer or "auto" (anything else is a typo)."""
    if isinstance(value, str) and value != AUTO:
        raise ValueError(f"parallel.{name}={value!r} must be a positive integer or 'auto'")


def auto_global_batch(config: Config, world_size: int) -> int:
    """The global batch layouts are compared at: trainer.global_batch_size, or when 0 the batch
    of the configured degrees (auto counting as 1): micro_batch_size x grad_accum x dp, where
    dp = world / (tensor x pipeline x context), or the world when that does not divide it."""
    t, p = config.trainer, config.parallel
    if t.global_batch_size:
        return t.global_batch_size
    model = int(p.tensor if p.tensor != AUTO else 1) * int(p.pipeline if p.pipeline != AUTO else 1)
    model *= p.context
    dp = world_size // model if world_size % model == 0 else world_size
    return t.micro_batch_size * t.grad_accum * max(1, dp)


def choose_layout(
    config: Config, world_size: int, local_world_size: int, *, device_type: str
) -> AutoLayout:
    """The fastest valid layout that fits (else the one needing least memory) with every
    non-auto key as configured; ValueError naming why when no degree is valid."""
    p = config.parallel
    global_batch = auto_global_batch(config, world_size)
    cluster = resolve_cluster(
        config.cluster,
        str(p.precision),
        cache_dir=config.data.cache_dir,
        world_size=world_size,
        local_world_size=local_world_size,
    )
    per_node = min(cluster.gpus_per_node, world_size)
    cluster = replace(cluster, gpus_per_node=per_node, nodes=-(-world_size // per_node))
    work = Workload.of(config, global_batch)
    tensors = [p.tensor] if p.tensor != AUTO else divisors(min(world_size, per_node))
    reasons: dict[str, int] = {}
    evaluated: list[Evaluated] = []
    for tp in tensors:
        model = int(tp) * p.context
        pipelines = [p.pipeline] if p.pipeline != AUTO else divisors(world_size // model)
        for pp in pipelines:
            at = at_layout(config, int(tp), int(pp), global_batch)
            try:
                layout = resolve_layout(int(tp), p.data, world_size, int(pp), p.context)
                validate(at, layout, device_type=device_type)
            except ValueError as err:
                reasons[str(err)] = reasons.get(str(err), 0) + 1
                continue
            evaluated.append(evaluate(work, candidate_of(at, layout.dp), cluster))
    if not evaluated:
        why = "; ".join(sorted(reasons)[:3])
        raise ValueError(
            f"{auto_label(auto_keys(config))}: no layout of world "
            f"{world_size} is valid with the other keys as set: {why}"
        )
    fitting = sorted((e for e in evaluated if e.fits), key=rank_key)
    ranked = fitting or sorted(evaluated, key=lambda e: e.memory.total)
    return AutoLayout(
        ranked[0], ranked[1] if len(ranked) > 1 else None, len(evaluated), cluster, global_batch
    )


def at_layout(config: Config, tp: int, pp: int, global_batch: int) -> Config:
    """A copy of `config` at these degrees, with the global batch fixed (grad_accum derived)."""
    parallel = replace(config.parallel, tensor=tp, pipeline=pp)
    trainer = replace(config.trainer, global_batch_size=global_batch)
    return replace(config, parallel=parallel, trainer=trainer)


def apply_auto_layout(config: Config, choice: AutoLayout) -> None:
    """Write the chosen degrees (and the global batch compared at) into the run's config."""
    c = choice.chosen.candidate
    config.parallel.tensor, config.parallel.pipeline = c.tp, c.pp
    config.trainer.global_batch_size = choice.global_batch
    apply_global_batch(config.trainer, c.dp)
