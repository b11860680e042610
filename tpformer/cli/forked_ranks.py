"""Local CPU ranks forked from the launcher: each rank starts with torch, Hydra and tpformer
already imported instead of paying the interpreter's start-up again.

`launcher.nproc_per_node=N` on the CPU used to start N fresh `python -u -m <module>` processes,
each importing torch, dynamo, Hydra and transformers before its first line of work, while the
launcher that starts them has every one of those modules loaded (a tiny 2-rank `tpformer-pretrain`
on the 2-core development machine: 8.3-10.3 -> 6.5-6.9 s of CPU forked). torch's launcher
(`torch.distributed.launcher.elastic_launch`) also takes a function as the entry point and starts
it under a multiprocessing start method: `fork` gives each rank a copy of the launcher's
interpreter, modules and all. The rank then runs the console script's module as `python -m` would
(`runpy`, `__main__`, its overrides as argv), composing its config through Hydra like a fresh
process; torch's launcher sets RANK, WORLD_SIZE and the rest in it, restarts and watches it as any
rank.

Only without CUDA: a process that has touched the CUDA driver (the launcher counts the GPUs)
must not fork ranks that use it, so on GPUs each rank stays a fresh interpreter, as under
`torchrun`. What a forked rank inherits is made to match a fresh one: its own session (a
terminal's Ctrl-C reaches the launcher, which forwards it, as torch's launcher does for the
processes it starts), Hydra's global state cleared, unbuffered output on its own descriptors
(`python -u`: not the launcher's Python-level streams, which a caller may have redirected), and
the intra-op threads that the launcher's OMP_NUM_THREADS asks for.
"""

from __future__ import annotations

import io
import os
import runpy
import sys
import warnings
from collections.abc import Sequence


def run_rank(module: str, *overrides: str) -> None:
    """The body of one forked rank: `python -u -m module overrides...` in this process."""
    os.setsid()  # a session of its own, as torch's launcher gives a rank it starts
    as_a_fresh_process()
    run_module_as_main(module, overrides)


def as_a_fresh_process() -> None:
    """What a forked process inherited and a fresh interpreter would not have: the parent's
    Python-level streams (a redirection of its own, or unwritten text), the intra-op threads
    libgomp set from OMP_NUM_THREADS when torch loaded, and the parent's Hydra run."""
    import torch
    from hydra.core.global_hydra import GlobalHydra

    sys.stdout = _unbuffered(1, sys.__stdout__)
    sys.stderr = _unbuffered(2, sys.__stderr__)
    threads = os.environ.get("OMP_NUM_THREADS", "")
    if threads.isdigit() and int(threads) > 0:
        torch.set_num_threads(int(threads))
    GlobalHydra.instance().clear()


def run_module_as_main(module: str, args: Sequence[str]) -> None:
    """`python -m module args...` in this process (the module may be imported already)."""
    sys.argv = [sys.argv[0], *args]
    with warnings.catch_warnings():  # imported by the parent: run it as __main__ anyway
        warnings.filterwarnings("ignore", f"'{module}' found in sys.modules", RuntimeWarning)
        runpy.run_module(module, run_name="__main__", alter_sys=True)


def _unbuffered(fd: int, inherited: object) -> io.TextIOWrapper:
    """A text stream over `fd` as `python -u` makes it (no buffer, every write passed through)."""
    encoding = getattr(inherited, "encoding", None) or "utf-8"
    errors = getattr(inherited, "errors", None) or "backslashreplace"
    raw = io.FileIO(fd, "w", closefd=False)
    return io.TextIOWrapper(raw, encoding=encoding, errors=errors, write_through=True)


def can_fork_ranks() -> bool:
    """Whether the local ranks may be forked from this process: no CUDA device in use."""
    import torch

    return not torch.cuda.is_available() and sys.platform.startswith("linux")
