"""A console script's start-up without full garbage collections.

Every console script and every rank it launches imports torch, dynamo, Hydra and often
transformers first: millions of long-lived objects, and CPython's cyclic collector runs full
collections over the growing heap meanwhile that free almost nothing (on the 2-core development
machine, importing torch, dynamo, Hydra and transformers: 8.4 -> 7.1 s of CPU with the full
collections deferred; a tiny one-process `tpformer-pretrain` run, three of each back to back:
9.3 -> 6.3 s of wall time, 8.0 -> 5.4 s of CPU). Every rank of every launch pays it, on a laptop
and on each GPU of a node.

`defer_full_collections` (called where a console script's package is imported, before torch)
leaves the young generations collected as usual and makes full collections rare;
`end_start_up` (called when training begins) freezes what start-up built, so later full
collections skip the imported modules and the built model, and restores the thresholds. The
scripts that do not train (plan, convert, generate) keep the deferral to their end: young
generations are still collected, full collections every FULL_COLLECTIONS_EVERY passes of the
middle one. Neither call does anything in a process that did not defer: a library user's or a
test's own process keeps its collector untouched."""

from __future__ import annotations

import gc
import sys
from pathlib import Path

FULL_COLLECTIONS_EVERY = 1000
"""Young-generation passes between full collections during start-up (CPython's default: 10)."""

_deferred: tuple[int, int, int] | None = None
"""The thresholds to restore, while start-up defers full collections."""


def is_console_script() -> bool:
    """Whether this interpreter runs one of tpformer's console scripts (`tpformer-*`) or
    `python -m tpformer.cli...` (as torchrun starts the ranks)."""
    argv = getattr(sys, "orig_argv", sys.argv)
    module = argv[argv.index("-m") + 1] if "-m" in argv[:-1] else ""
    return module.startswith("tpformer.cli") or Path(sys.argv[0]).name.startswith("tpformer-")


def defer_full_collections() -> None:
    """Make full collections rare until `end_start_up` (young generations unchanged)."""
    global _deferred
    if _deferred is None:
        _deferred = gc.get_threshold()
        gc.set_threshold(_deferred[0], _deferred[1], FULL_COLLECTIONS_EVERY)


def end_start_up() -> None:
    """Freeze what start-up allocated and restore the collector's thresholds, once, in a
    process that deferred; otherwise nothing."""
    global _deferred
    if _deferred is not None:
        gc.freeze()
        gc.set_threshold(*_deferred)
        _deferred = None
