"""Layout-independent randomness.

A dropout mask is a pure function of (seed, step, site, global sample index, position in the
sample), never of which rank computes it. Each rank seeds a generator per sample it owns (a DP
rank its own samples) and keeps its slice of each (a TP rank its heads). So TP=2 or DP=2 with
dropout on reproduces the TP=1 losses, and recomputation (activation checkpointing) redraws the
same masks for free as long as the position has not moved.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from contextlib import contextmanager

import torch

_MASK64 = (1 << 64) - 1


def _splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def _fold(h: int, keys: tuple[int, ...]) -> int:
    for key in keys:
        h = _splitmix64(h ^ (key & _MASK64))
    return h


def derive_seed(*keys: int) -> int:
    """A 63-bit seed that depends on every key and on their order."""
    return _fold(0, keys) >> 1


def name_key(name: str) -> int:
    """A stable integer for a module or parameter name (same in every process and layout)."""
    return zlib.crc32(name.encode("utf-8"))


class RNGTracker:
    """Holds the seed and the current (step, first global sample) of the micro-batch.

    NOTE: the training loop calls `set_position(step, sample_offset)` before every micro-batch;
    without it every forward redraws the masks of position (0, 0).
    """

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.step = 0
        self.sample_offset = 0
        self.mask_width = 0
        """The widest micro-batch (tokens) of the current global step, set by the training loop:
        attention masks are drawn at this width, so they do not depend on a micro-batch's own
        padding (see ParallelDropout)."""
        self._generators: dict[torch.device, torch.Generator] = {}

    def set_position(self, step: int, sample_offset: int = 0) -> None:
        """Key the masks of the next forward by the step and the global index of its first
        sample."""
        self.step, self.sample_offset = step, sample_offset

    def sample_generators(
        self, device: torch.device, site: int, count: int
    ) -> Iterator[torch.Generator]:
        """The generators of `count` consecutive global samples from `sample_offset` at
        `site`: the same one re-seeded by (seed, step, site, sample) before each yield."""
        gen = self._generators.get(device)
        if gen is None:
            gen = self._generators[device] = torch.Generator(device=device)
        prefix = _fold(0, (self.seed, self.step, site))
        for sample in range(self.sample_offset, self.sample_offset + count):
            gen.manual_seed(_splitmix64(prefix ^ sample) >> 1)
            yield gen

    def init_generator(self, name: str) -> torch.Generator:
        """CPU generator for the layout-independent initialization of parameter `name`."""
        gen = torch.Generator()
        gen.manual_seed(derive_seed(self.seed, name_key(name), 0x1B17))
        return gen

    @contextmanager
    def restored(self, state: dict[str, int]) -> Iterator[None]:
        """Run the block at the position `state` was taken at (recomputation), then come back."""
        current = self.state_dict()
        self.load_state_dict(state)
        try:
            yield
        finally:
            self.load_state_dict(current)

    def state_dict(self) -> dict[str, int]:
        return {
            "seed": self.seed,
            "step": self.step,
            "sample_offset": self.sample_offset,
            "mask_width": self.mask_width,
        }

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.seed, self.step, self.sample_offset = (
            state["seed"],
            state["step"],
            state["sample_offset"],
        )
        self.mask_width = state.get("mask_width", 0)
