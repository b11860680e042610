"""How a rank's process groups come to exist: torch.distributed initialized from the launcher's
variables, every rank's layout checked equal, then the ("pp", "dp", "cp", "tp") DeviceMesh and
the groups beside it (DP x CP, the pipeline ends, the gloo control group), or, for PipeDream's
replicated stages, the groups made directly. ParallelContext (parallel/context.py) is the
record of what this builds."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from tpformer.parallel.env import LaunchEnv
from tpformer.parallel.handle import GroupHandle
from tpformer.parallel.layout import Layout

DEFAULT_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class RankGroups:
    """This rank's handle of each group, as ParallelContext holds them (its fields' docs)."""

    tp: GroupHandle
    dp: GroupHandle
    pp: GroupHandle
    cp: GroupHandle = field(default_factory=GroupHandle.single)
    dp_cp: GroupHandle | None = None
    pipeline_ends: GroupHandle = field(default_factory=GroupHandle.single)
    control: GroupHandle = field(default_factory=GroupHandle.single)


def default_device(env: LaunchEnv) -> torch.device:
    """This rank's GPU (by LOCAL_RANK) when CUDA is available, else the CPU."""
    if torch.cuda.is_available():
        return torch.device("cuda", env.local_rank)
    return torch.device("cpu")


def init_distributed(env: LaunchEnv, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
    """Initialize torch.distributed from the variables torchrun sets; NCCL on CUDA, gloo on CPU.

    A no-op when it is already initialized (tests initialize through a file store first).
    """
    if dist.is_initialized():
        return
    if env.missing:
        raise ValueError(
            f"torch.distributed is not initialized and {', '.join(env.missing)} is not set; "
            "launch with torchrun (or launcher.nproc_per_node=N), or build the model with "
            "ParallelContext.single() for one process"
        )
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(env.local_rank)
    timeout = timedelta(seconds=timeout_s)
    store, rank, world_size = next(dist.rendezvous("env://", timeout=timeout))
    # torchrun keeps one store for all restart attempts, and the ranks' keys carry no attempt
    # number: after `--max-restarts` restarts the workers, gloo would read the dead ranks'
    # addresses left by the previous attempt and hang or be refused. One prefix per attempt.
    store = dist.PrefixStore(f"tpformer/attempt{env.restart_count}/", store)
    dist.init_process_group(
        backend=backend, store=store, rank=rank, world_size=world_size, timeout=timeout
    )


def mesh_groups(
    layout: Layout, device: torch.device, shortcuts: bool
) -> tuple[DeviceMesh, RankGroups]:
    """The regular grid: the ("pp", "dp", "cp", "tp") DeviceMesh and this rank's groups."""
    rank = dist.get_rank()
    mesh = init_device_mesh(
        device.type,
        (layout.pp, layout.dp, layout.cp, layout.tp),
        mesh_dim_names=("pp", "dp", "cp", "tp"),
    )
    dp_rank, tp_rank = layout.coords(rank)
    dp = _handle(mesh, "dp", dp_rank, layout.dp, shortcuts)
    cp = _handle(mesh, "cp", layout.cp_rank_of(rank), layout.cp, shortcuts)
    return mesh, RankGroups(
        tp=_handle(mesh, "tp", tp_rank, layout.tp, shortcuts),
        dp=dp,
        cp=cp,
        dp_cp=_dp_cp_group(layout, rank, dp, cp, shortcuts),
        pp=_handle(mesh, "pp", layout.stage_of(rank), layout.pp, shortcuts),
        pipeline_ends=_pipeline_ends(layout, rank, shortcuts),
        control=_control_group(rank, layout.world_size),
    )


def replicated_groups(layout: Layout, shortcuts: bool) -> RankGroups:
    """Replicated stages (PipeDream's "2-1"): no rectangular mesh exists, so the groups are
    made directly. `dp` is a single handle (every rank reads the whole batch; a replica keeps
    its micro-batches), `dp_cp` the stage's replicas (the engine sums their gradients), `pp`
    the world (messages are addressed by global rank, `layout.peer`)."""
    rank = dist.get_rank()
    if dist.get_world_size() != layout.world_size:
        raise ValueError(
            f"parallel.pipeline_replicas={list(layout.stage_workers)} uses "
            f"{layout.world_size} workers but the process group has "
            f"{dist.get_world_size()} ranks"
        )
    check_same_layout(layout)
    world = dist.group.WORLD
    assert world is not None
    replicas = _own_group(layout.dp_groups(), rank, shortcuts)
    return RankGroups(
        tp=GroupHandle.single(),
        dp=GroupHandle.single(),
        dp_cp=replicas if replicas.size > 1 else GroupHandle.single(),
        pp=GroupHandle(world, rank, layout.world_size, gloo_shortcuts=shortcuts),
        control=_control_group(rank, layout.world_size),
    )


def check_same_layout(layout: Layout) -> None:
    """Every rank must build the same mesh: a layout derived differently on some rank (a
    parallel.tensor=auto choice from another node's calibration file, a different config) is
    named here instead of hanging or mis-pairing in the groups' creation."""
    if dist.get_world_size() == 1:
        return
    layouts: list[object] = [None] * dist.get_world_size()
    dist.all_gather_object(layouts, layout.describe())
    if len(set(layouts)) > 1:
        shown = ", ".join(f"rank {r}: {shape}" for r, shape in enumerate(layouts))
        raise ValueError(
            f"the ranks derived different layouts ({shown}): give every rank the same config "
            "(with parallel.tensor/pipeline=auto, the same cluster.calibration file, or "
            "cluster.calibration=none)"
        )


def _handle(mesh: DeviceMesh, dim: str, rank: int, size: int, shortcuts: bool) -> GroupHandle:
    if size == 1:
        return GroupHandle.single()
    group = mesh.get_group(dim)
    if dist.get_rank(group) != rank:
        raise RuntimeError(f"mesh dim {dim!r}: rank {dist.get_rank(group)} != layout rank {rank}")
    return GroupHandle(group=group, rank=rank, size=size, gloo_shortcuts=shortcuts)


def _dp_cp_group(
    layout: Layout, rank: int, dp: GroupHandle, cp: GroupHandle, shortcuts: bool
) -> GroupHandle | None:
    """DP x CP as one group: None when cp == 1 (the dp handle is it), the cp handle when
    dp == 1, else one new group per (stage, TP rank), created by every rank in the same order."""
    if layout.cp == 1:
        return None
    if layout.dp == 1:
        return cp
    return _own_group(layout.dp_cp_groups(), rank, shortcuts)


def _own_group(groups: list[list[int]], rank: int, shortcuts: bool) -> GroupHandle:
    """Create every group of `groups` (every rank creates every group, in the same order, as
    torch.distributed requires) and return this rank's handle (the single one if in none)."""
    mine = GroupHandle.single()
    for ranks in groups:
        group = dist.new_group(ranks)
        if rank in ranks:
            mine = GroupHandle(group, ranks.index(rank), len(ranks), gloo_shortcuts=shortcuts)
    return mine


def fake_world() -> bool:
    """The default group is on the fake backend (a dry run's, parallel/fake_world.py: named for
    every device type)."""
    backend = str(dist.get_backend())
    return backend == "fake" or backend.endswith(":fake")


def _control_group(rank: int, world: int) -> GroupHandle:
    """The world on gloo: the default group when it is gloo (or the fake backend of a dry run,
    whose collectives complete at once), else a gloo twin of it."""
    if world == 1:
        return GroupHandle.single()
    on_host = dist.get_backend() == "gloo" or fake_world()
    group = dist.group.WORLD if on_host else dist.new_group(backend="gloo")
    assert group is not None
    return GroupHandle(group=group, rank=rank, size=world)


def _pipeline_ends(layout: Layout, rank: int, shortcuts: bool) -> GroupHandle:
    """The group of each pipeline's first and last stage; the single handle on middle stages."""
    if layout.pp == 1:
        return GroupHandle.single()
    return _own_group([[ranks[0], ranks[-1]] for ranks in layout.pp_groups()], rank, shortcuts)
