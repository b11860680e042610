"""ParallelContext: the DeviceMesh ("pp", "dp", "cp", "tp"), its group handles and the RNG tracker.

It is created once per run and passed explicitly: blocks take the context, linear/embedding/loss
take `ctx.tp`. Nothing here is a module-level global, so tests create and destroy several
contexts in one process. How the groups come to exist is parallel/groups.py; this is their
record.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

from tpformer.parallel.env import LaunchEnv
from tpformer.parallel.groups import (
    DEFAULT_TIMEOUT_S,
    RankGroups,
    check_same_layout,
    default_device,
    fake_world,
    init_distributed,
    mesh_groups,
    replicated_groups,
)
from tpformer.parallel.handle import GroupHandle
from tpformer.parallel.layout import Layout, replicated_layout, resolve_layout
from tpformer.parallel.monitor import CommMonitor
from tpformer.parallel.random import RNGTracker, resolve_rng_mode


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
        check_same_layout(layout)
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
        """The regular grid's context; the RNG's fast-mode streams keyed by this rank's TP and
        CP ranks."""
        rank = dist.get_rank()
        rng.stream_rank, rng.context_rank = layout.coords(rank)[1], layout.cp_rank_of(rank)
        mesh, groups = mesh_groups(layout, device, shortcuts)
        return cls._of(layout, rank, rng, device, groups, mesh, sequence_parallel)

    @classmethod
    def _replicated(
        cls, layout: Layout, rng: RNGTracker, device: torch.device, shortcuts: bool
    ) -> ParallelContext:
        """Replicated stages (parallel/groups.replicated_groups): no mesh."""
        groups = replicated_groups(layout, shortcuts)
        return cls._of(layout, dist.get_rank(), rng, device, groups)

    @classmethod
    def _of(
        cls,
        layout: Layout,
        rank: int,
        rng: RNGTracker,
        device: torch.device,
        groups: RankGroups,
        mesh: DeviceMesh | None = None,
        sequence_parallel: bool = False,
    ) -> ParallelContext:
        g = groups
        return cls(
            layout=layout, rank=rank, tp=g.tp, dp=g.dp, rng=rng, device=device, mesh=mesh,
            sequence_parallel=sequence_parallel, pp=g.pp, pipeline_ends=g.pipeline_ends,
            cp=g.cp, dp_cp=g.dp_cp, control=g.control,
        )  # fmt: skip

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
        if fake_world():
            return dist.group.WORLD
        return dist.new_group(backend="gloo")

    def destroy(self) -> None:
        """Destroy every process group so another context can be created in this process."""
        if self.mesh is not None and dist.is_initialized():
            dist.destroy_process_group()
            self.monitor.recorder.reset()  # its groups are gone (their ids may be reused)
        self.mesh = None
