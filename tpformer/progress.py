"""Progress displays that behave both on a terminal and in a log file.

On a terminal, a tqdm bar. Anywhere else (SLURM, nohup, a redirect) a bar's redraws would be
written out as text, one per refresh; there the same calls produce a plain log line at most every
`every` updates (training: trainer.log_every steps) or, when no `every` is given, every
`interval_s` seconds, with the count, the rate, the ETA and the latest postfix.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Iterable, Iterator
from typing import Any, Protocol, TypeVar

from tqdm import tqdm

T = TypeVar("T")
log = logging.getLogger("tpformer.progress")

LOG_INTERVAL_S = 30.0
"""Seconds between two log lines of a display that has no step interval of its own."""


class Progress(Protocol):
    """The part of tqdm's interface tpformer uses."""

    def update(self, n: int = 1) -> Any: ...

    def set_postfix(self, refresh: bool = True, **values: Any) -> None: ...

    def close(self) -> None: ...


def _clock(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600:d}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


class LogProgress:
    """tqdm's update / set_postfix / close / iteration, written as occasional log lines."""

    def __init__(
        self,
        iterable: Iterable[Any] | None = None,
        *,
        desc: str,
        unit: str = " it",
        total: int | None = None,
        initial: int = 0,
        every: int | None = None,
        interval_s: float = LOG_INTERVAL_S,
        clock: Any = time.monotonic,
    ) -> None:
        self.iterable, self.desc, self.unit, self.total = iterable, desc, unit, total
        self.n = self._logged_n = self._start_n = initial
        self.every, self.interval_s, self._clock = every, interval_s, clock
        self._start = self._logged_at = clock()
        self.postfix = ""

    def __iter__(self) -> Iterator[Any]:
        assert self.iterable is not None, "LogProgress was given no iterable"
        for item in self.iterable:
            yield item
            self.update(1)
        self.close()

    def update(self, n: int = 1) -> None:
        self.n += n
        now = self._clock()
        if self.every is not None:
            due = self.n // self.every > self._logged_n // self.every
        else:
            due = now - self._logged_at >= self.interval_s
        if due:
            self._write(now)

    def set_postfix(self, refresh: bool = True, **values: Any) -> None:
        """Shown with the next line; `refresh` is tqdm's (redraw now), a line waits its turn."""
        self.postfix = ", ".join(f"{k}={v}" for k, v in values.items())

    def close(self) -> None:
        if self.n != self._logged_n:
            self._write(self._clock())

    def line(self, now: float) -> str:
        elapsed = now - self._start
        rate = (self.n - self._start_n) / elapsed if elapsed > 0 else 0.0
        count = f"{self.n:,}/{self.total:,}{self.unit}" if self.total else f"{self.n:,}{self.unit}"
        text = f"{self.desc}: {count}, {rate:,.2f}{self.unit}/s, elapsed {_clock(elapsed)}"
        if self.total and rate > 0:
            text += f", ETA {_clock((self.total - self.n) / rate)}"
        return text + (f" | {self.postfix}" if self.postfix else "")

    def _write(self, now: float) -> None:
        log.info("%s", self.line(now))
        self._logged_n, self._logged_at = self.n, now


def progress(
    iterable: Iterable[T] | None = None,
    *,
    desc: str,
    unit: str = " it",
    total: int | None = None,
    initial: int = 0,
    enabled: bool = True,
    every: int | None = None,
) -> Any:
    """A tqdm bar on a terminal, a LogProgress elsewhere, a disabled tqdm when not enabled."""
    if enabled and not sys.stderr.isatty():
        return LogProgress(
            iterable, desc=desc, unit=unit, total=total, initial=initial, every=every
        )
    return tqdm(
        iterable,
        desc=desc,
        unit=unit,
        total=total,
        initial=initial,
        dynamic_ncols=True,
        disable=not enabled,
    )


def quiet_datasets_off_a_terminal() -> None:
    """`datasets` draws its own tqdm bars (loading, mapping); off a terminal they follow ours
    and stay out of the log. Call before using datasets."""
    if not sys.stderr.isatty():
        import datasets

        datasets.disable_progress_bars()
