"""The launcher's environment (torchrun's variables), read once per process into a frozen record.

Everything that depends on how the process was started (world size before the process group
exists, the local device, the restart attempt) takes a LaunchEnv instead of reading os.environ.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
FAILURE_DIR_VAR = "TPFORMER_FAILURE_DIR"


@dataclass(frozen=True)
class LaunchEnv:
    """How this process was started: by torchrun / `launcher.nproc_per_node`, or on its own."""

    under_launcher: bool
    """LOCAL_RANK is set: this process is one rank of a launched job."""
    world_size: int
    """WORLD_SIZE, or 1 outside a launcher."""
    local_rank: int
    local_world_size: int
    """LOCAL_WORLD_SIZE: ranks on this node (WORLD_SIZE when not set)."""
    restart_count: int
    """TORCHELASTIC_RESTART_COUNT: which attempt of a job restarted by torchrun this is."""
    missing: tuple[str, ...]
    """torchrun variables torch.distributed's env:// rendezvous needs that are not set."""
    failure_dir: str | None = None
    """TPFORMER_FAILURE_DIR: where tpformer's local launcher collects the ranks' one-line
    errors to print once (cli/failures.py); None under a launcher of the user's own."""

    @classmethod
    def read(cls, environ: Mapping[str, str] | None = None) -> LaunchEnv:
        env = os.environ if environ is None else environ
        return cls(
            under_launcher="LOCAL_RANK" in env,
            world_size=int(env.get("WORLD_SIZE", "1")),
            local_rank=int(env.get("LOCAL_RANK", "0")),
            local_world_size=int(env.get("LOCAL_WORLD_SIZE", env.get("WORLD_SIZE", "1"))),
            restart_count=int(env.get("TORCHELASTIC_RESTART_COUNT", "0")),
            missing=tuple(v for v in TORCHRUN_VARS if v not in env),
            failure_dir=env.get(FAILURE_DIR_VAR),
        )
