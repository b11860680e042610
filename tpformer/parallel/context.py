"""ParallelContext: the DeviceMesh ("pp", "dp", "cp", "tp"), its group handles and the RNG tracker.

It is created once per run and passed explicitly: blocks take the context, linear/embedding/loss
take `ctx.tp`. Nothing here is a module-level global, so tests create and destroy several
contexts in one process.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from tpformer.parallel.env import LaunchEnv
from tpformer.parallel.layout import Layout, replicated_layout, resolve_layout
from tpformer.parallel.monitor import CommMonitor
from tpformer.parallel.random import RNGTracker, resolve_rng_mode

DEFAULT_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class GroupHandle:
    """A frozen (group, rank, size) view of one mesh dimension; group is None when size == 1.

    `gloo_shortcuts`: on gloo, comm may take CPU-only shortcuts for this group (two-rank swaps,
    reduce-scatter as all-reduce + slice); False keeps the generic path NCCL takes."""

    group: dist.ProcessGroup | None
    rank: int
    size: int
    gloo_shortcuts: bool = True
    monitor: CommMonitor | None = field(default=None, compare=False, repr=False)
    """Where the collectives on this group report (their context's; None: nowhere)."""

    def __post_init__(self) -> None:
        if self.size < 1 or not 0 <= self.rank < self.size:
            raise ValueError(f"invalid group handle: rank={self.rank}, size={self.size}")
        if self.group is None:
            if self.size != 1:
                raise ValueError(f"a group of size {self.size} needs a process group, got None")
            return
        actual = dist.get_world_size(self.group)
        if actual != self.size:
            raise ValueError(
                f"process group has {actual} ranks but the handle says size={self.size}; "
                "pass the group that matches the layout (ctx.tp or ctx.dp)"
            )

    @staticmethod
    def single() -> GroupHandle:
        return GroupHandle(group=None, rank=0, size=1)


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


@dataclass
class ParallelContext:
    """Process groups, layout, device and RNG of one rank.

    `tp`, `dp`, `cp` and `pp` are GroupHandles; `mesh` is the DeviceMesh with dims ("pp", "dp",
    "cp", "tp") (None for the single-process context). `cp` is this rank's context-parallel
    ring (ranks holding other chunks of the same sequences); `dp_cp` spans DP x CP, the ranks
    holding the same parameters, whose gradients the engine sums (the dp handle itself when
    cp == 1). `pp` links the stages of this rank's pipeline;
    `pipeline_ends` links its first and last stage (they both hold the tied word embedding).
    With replicated stages (`layout.stage_workers`), `pp` is the world, and `layout.peer` names the
    rank of a stage that runs a given micro-batch.
    `sequence_parallel`: the TP group also splits the sequence outside its tensor-parallel
    regions (Megatron-SP); layers read it when they are built.
    """

    layout: Layout
    rank: int
    tp: GroupHandle
    dp: GroupHandle
    rng: RNGTracker
    device: torch.device
    mesh: DeviceMesh | None = None
    sequence_parallel: bool = False
    pp: GroupHandle = field(default_factory=GroupHandle.single)
    pipeline_ends: GroupHandle = field(default_factory=GroupHandle.single)
    cp: GroupHandle = field(default_factory=GroupHandle.single)
    dp_cp: GroupHandle | None = None
    """DP x CP; None (the default) means the dp handle (no context parallelism)."""
    control: GroupHandle = field(default_factory=GroupHandle.single)
    """Every rank on a CPU (gloo) group: host-side agreements (stop flags) that must not wait
    for the device. The world group itself when the backend is gloo."""
    monitor: CommMonitor = field(default_factory=CommMonitor)
    """The hang report's recorder and the wait clock of this context's collectives."""

    def __post_init__(self) -> None:
        """Every handle reports to this context's monitor, which names its group by role."""
        for role in ("tp", "dp", "cp", "pp", "dp_cp", "pipeline_ends", "control"):
            handle = getattr(self, role)
            if handle is not None and handle.group is not None:
                setattr(self, role, replace(handle, monitor=self.monitor))
                self.monitor.recorder.name_group(handle.group, role)

    @classmethod
    def single(
        cls, seed: int = 1234, device: torch.device | str | None = None, rng: str = "auto"
    ) -> ParallelContext:
        """The one-process context: no torch.distributed, every collective is the identity.
        `rng`: parallel.rng (auto: fast on an accelerator, exact on the CPU)."""
        device = torch.device(device) if device is not None else default_device(LaunchEnv.read())
        return cls(
            layout=Layout(dp=1, tp=1),
            rank=0,
            tp=GroupHandle.single(),
            dp=GroupHandle.single(),
            rng=RNGTracker(seed, resolve_rng_mode(rng, device), device=device),
            device=device,
        )

    @classmethod
    def create(
        cls,
        tensor: int = 1,
        data: int | str = "auto",
        *,
        seed: int = 1234,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        device: torch.device | None = None,
        env: LaunchEnv | None = None,
        sequence_parallel: bool = False,
        pipeline: int = 1,
        rng: str = "auto",
        gloo_shortcuts: bool = True,
        context: int = 1,
        replicas: list[int] | tuple[int, ...] | None = None,
    ) -> ParallelContext:
        """Check the layout against the world size, initialize torch.distributed if needed (from
        `env`, read from the environment when not given), and build the mesh.

        The layout is checked before any collective is issued, against WORLD_SIZE when the
        process group does not exist yet. `rng`: parallel.rng (auto: fast on an accelerator,
        exact on the CPU); fast-mode streams of sharded regions are keyed by the TP rank.
        `gloo_shortcuts`: parallel.gloo_shortcuts, carried by every group handle. `context`:
        parallel.context, the CP degree. `replicas`: parallel.pipeline_replicas (PipeDream's
        replicated stages; see `_replicated`).
        """
        env = env if env is not None else LaunchEnv.read()
        world = dist.get_world_size() if dist.is_initialized() else env.world_size
        if replicas:
            layout = replicated_layout(
                replicas, world, tensor=tensor, data=data, context=context, pipeline=pipeline
            )
            init_distributed(env, timeout_s=timeout_s)
            device = device if device is not None else default_device(env)
            tracker = RNGTracker(seed, resolve_rng_mode(rng, device), device=device)
            return cls._replicated(layout, tracker, device, gloo_shortcuts)
        layout = resolve_layout(tensor, data, world, pipeline, context)
        if sequence_parallel and layout.tp == 1:
            raise ValueError(
                "sequence parallelism splits the sequence over the TP group and "
                f"needs tensor > 1 (got tensor={tensor})"
            )
        init_distributed(env, timeout_s=timeout_s)
        if dist.get_world_size() != layout.world_size:
            raise RuntimeError(
                f"WORLD_SIZE={world} but the process group has {dist.get_world_size()} ranks"
            )
        _check_same_layout(layout)
        device = device if device is not None else default_device(env)
        tracker = RNGTracker(seed, resolve_rng_mode(rng, device), device=device)
        return cls._on_mesh(layout, tracker, device, sequence_parallel, gloo_shortcuts)

    @classmethod
    def _on_mesh(
        cls,
        layout: Layout,
        rng: RNGTracker,
        device: torch.device,
        sequence_parallel: bool,
        shortcuts: bool,
    ) -> ParallelContext:
        """The regular grid: the ("pp", "dp", "cp", "tp") DeviceMesh and this rank's handles;
        the RNG's fast-mode streams keyed by this rank's TP and CP ranks."""
        rank = dist.get_rank()
        mesh = init_device_mesh(
            device.type,
            (layout.pp, layout.dp, layout.cp, layout.tp),
            mesh_dim_names=("pp", "dp", "cp", "tp"),
        )
        dp_rank, tp_rank = layout.coords(rank)
        cp_rank = layout.cp_rank_of(rank)
        rng.stream_rank, rng.context_rank = tp_rank, cp_rank
        dp = _handle(mesh, "dp", dp_rank, layout.dp, shortcuts)
        cp = _handle(mesh, "cp", cp_rank, layout.cp, shortcuts)
        return cls(
            layout=layout,
            rank=rank,
            tp=_handle(mesh, "tp", tp_rank, layout.tp, shortcuts),
            dp=dp,
            cp=cp,
            dp_cp=_dp_cp_group(layout, rank, dp, cp, shortcuts),
            rng=rng,
            device=device,
            mesh=mesh,
            sequence_parallel=sequence_parallel,
            pp=_handle(mesh, "pp", layout.stage_of(rank), layout.pp, shortcuts),
            pipeline_ends=_pipeline_ends(layout, rank, shortcuts),
            control=_control_group(rank, layout.world_size),
        )

    @classmethod
    def _replicated(
        cls, layout: Layout, rng: RNGTracker, device: torch.device, shortcuts: bool
    ) -> ParallelContext:
        """Replicated stages (PipeDream's "2-1"): no rectangular mesh exists, so the groups are
        made directly. `dp` is a single handle (every rank reads the whole batch; a replica
        keeps its micro-batches), `dp_cp` the stage's replicas (the engine sums their
        gradients), `pp` the world (messages are addressed by global rank, `layout.peer`)."""
        rank = dist.get_rank()
        if dist.get_world_size() != layout.world_size:
            raise ValueError(
                f"parallel.pipeline_replicas={list(layout.stage_workers)} uses "
                f"{layout.world_size} workers but the process group has "
                f"{dist.get_world_size()} ranks"
            )
        _check_same_layout(layout)
        world = dist.group.WORLD
        assert world is not None
        everyone = GroupHandle(world, rank, layout.world_size, gloo_shortcuts=shortcuts)
        replicas = _own_group(layout.dp_groups(), rank, shortcuts)
        return cls(
            layout=layout,
            rank=rank,
            tp=GroupHandle.single(),
            dp=GroupHandle.single(),
            dp_cp=replicas if replicas.size > 1 else GroupHandle.single(),
            rng=rng,
            device=device,
            pp=everyone,
            control=_control_group(rank, layout.world_size),
        )

    def regroup(self, replicas: list[int]) -> ParallelContext:
        """This world with other replicas per stage (parallel.pipeline_split=pipedream chooses
        them once the model can be measured): new groups, the same RNG and device. The model
        built before is still valid: replicated layouts have no tensor parallelism."""
        layout = replicated_layout(replicas, self.layout.world_size, pipeline=self.layout.pp)
        return self._replicated(layout, self.rng, self.device, self.pp.gloo_shortcuts)

    @property
    def stage(self) -> int:
        """This rank's pipeline stage."""
        return self.layout.stage_of(self.rank)

    @property
    def stage_mesh(self) -> DeviceMesh | None:
        """The ("dp", "cp", "tp") mesh of this rank's pipeline stage (what its parameters
        span)."""
        return None if self.mesh is None else self.mesh["dp", "cp", "tp"]

    @property
    def replicas(self) -> GroupHandle:
        """The ranks holding the same parameters (DP x CP): what gradients are summed over and
        ZeRO shards over."""
        return self.dp if self.dp_cp is None else self.dp_cp

    @property
    def is_main(self) -> bool:
        """True on global rank 0: the rank that logs and writes shared files."""
        return self.rank == 0

    def host_group(self) -> dist.ProcessGroup | None:
        """A new gloo group of every rank, for collectives a background thread issues (the
        checkpoint writer's): its own, so they never interleave with another thread's on the
        control group. Every rank must call it, in the same order; None on one rank. (Under the
        fake backend of a dry run, the world group: its collectives complete at once.)"""
        if self.layout.world_size == 1:
            return None
        if _fake_world():
            return dist.group.WORLD
        return dist.new_group(backend="gloo")

    def destroy(self) -> None:
        """Destroy every process group so another context can be created in this process."""
        if self.mesh is not None and dist.is_initialized():
            dist.destroy_process_group()
            self.monitor.recorder.reset()  # its groups are gone (their ids may be reused)
        self.mesh = None


def _check_same_layout(layout: Layout) -> None:
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


def _fake_world() -> bool:
    """The default group is on the fake backend (a dry run's, parallel/fake_world.py: named for
    every device type)."""
    backend = str(dist.get_backend())
    return backend == "fake" or backend.endswith(":fake")


def _control_group(rank: int, world: int) -> GroupHandle:
    """The world on gloo: the default group when it is gloo (or the fake backend of a dry run,
    whose collectives complete at once), else a gloo twin of it."""
    if world == 1:
        return GroupHandle.single()
    on_host = dist.get_backend() == "gloo" or _fake_world()
    group = dist.group.WORLD if on_host else dist.new_group(backend="gloo")
    assert group is not None
    return GroupHandle(group=group, rank=rank, size=world)


def _pipeline_ends(layout: Layout, rank: int, shortcuts: bool) -> GroupHandle:
    """The group of each pipeline's first and last stage; the single handle on middle stages."""
    if layout.pp == 1:
        return GroupHandle.single()
    return _own_group([[ranks[0], ranks[-1]] for ranks in layout.pp_groups()], rank, shortcuts)
