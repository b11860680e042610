"""Keyed randomness: dropout masks as pure functions of the training position.

Two modes (`parallel.rng`), both deterministic and both replayed exactly by recomputation, which
restores the position:

exact  a mask is a function of (seed, step, site, global sample index, position in the sample),
       never of which rank computes it. Each rank seeds a generator per sample it owns (a DP
       rank its own samples) and keeps its slice of each (a TP rank its heads). So TP=2 or DP=2
       with dropout on reproduces the TP=1 losses: the validation mode.
fast   two parts, both without a host read and both replayed by recomputation:
       - the dropout of the attention probabilities is drawn inside `scaled_dot_product_attention`
         (the fused kernel's own Philox) from the device's default generator, seeded by (seed,
         step, first sample of the micro-batch, site, TP rank, CP rank) just before (Megatron's
         model-parallel stream: each TP rank's heads their own). Seeding is host-side; the
         generator's state is restored after. Under trainer.compile the compiled block is seeded
         with the same key before it runs (engine/compiled.py): the kernel is the block's only
         draw from the generator, so compiled and eager blocks draw the same masks.
       - every other dropout (residual branches, embeddings, heads) is a counter-based hash of
         (seed, step, site, global sample index, global position of the element in the sample)
         computed with integer tensor ops (`keep_mask`): no generator, so it traces into a
         compiled block's graph (one graph per block, fused with the residual add), its bits are
         the same compiled or eager, and it does not depend on the layout at all: TP ranks of a
         replicated region agree, a sequence-parallel chunk keeps its rows of the whole
         sequence's mask, and micro-batching does not matter. The position enters the graph as
         two int64 device tensors (`RNGTracker.step_key`, `.first_sample`), made anew by
         `set_position` (two fill kernels; no host-to-device copy, nothing read back).
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Protocol, TypeVar, runtime_checkable

import torch
from torch import Size, Tensor

RNG_MODES = ("exact", "fast")

_MASK64 = (1 << 64) - 1
_NO_POSITION = torch.zeros((), dtype=torch.int64)
"""exact mode keeps its position on the host only."""
Fn = TypeVar("Fn", bound=Callable)
EAGER_ISLAND = "__tpformer_eager_island__"


def eager_island(fn: Fn) -> Fn:
    """Mark `fn` to run outside torch.compile's graphs (trainer.compile): keyed dropout seeds
    generators from host state a graph would not replay, so it runs eagerly between the compiled
    parts and draws the eager run's masks. Only a mark: trainer.compile wraps the marked methods
    with torch.compiler.disable (engine/compiled.py), so a process that does not compile never
    imports dynamo (1.5 s per process here)."""
    setattr(fn, EAGER_ISLAND, True)
    return fn


@runtime_checkable
class DeviceStreamUser(Protocol):
    """A layer that draws from the device's default generator under fast mode (SDPA's fused
    dropout): `device_stream_site()` is the key its draw is seeded with, None when it draws
    nothing. A compiled block seeds that stream before it runs (engine/compiled.py)."""

    def device_stream_site(self) -> int | None: ...


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


_M32 = 0xFFFFFFFF


def hash32(x: Tensor) -> Tensor:
    """A 32-bit integer mix of int64 values in [0, 2^32) (Wellons' hash-prospector function,
    multipliers 0x21f0aaad and 0x735a2d97). The multipliers are below 2^31, so every product
    stays below 2^63: no signed overflow, the same bits on every device, compiled or eager."""
    x = x ^ (x >> 16)
    x = (x * 0x21F0AAAD) & _M32
    x = x ^ (x >> 15)
    x = (x * 0x735A2D97) & _M32
    return x ^ (x >> 15)


def keep_mask(
    step_key: Tensor,
    first_sample: Tensor,
    site_key: Tensor,
    positions: Tensor,
    shape: Size | tuple[int, ...],
    p: float,
) -> Tensor:
    """bool `shape` = [b, n, *inner]: keep (True) with probability 1 - p, a pure function of
    (step_key, site_key, global sample first_sample + i, global element index positions[j] *
    prod(inner) + k). step_key, first_sample, site_key: int64 0-d device tensors; positions:
    int64 [n], the global index along dim 1 (a sequence position or a head) of each local row.
    Two hash rounds per element: the second adds the sample's key after the first has mixed
    the element index with it, so two samples' masks are not permutations of each other."""
    b, n = shape[0], shape[1]
    inner = 1
    for d in shape[2:]:
        inner *= d
    site = hash32((step_key ^ site_key) & _M32)
    samples = first_sample + torch.arange(b, device=positions.device)
    sample_keys = hash32((samples & _M32) ^ site).view(b, 1, 1)
    index = positions.view(1, n, 1) * inner + torch.arange(inner, device=positions.device)
    mixed = hash32((index & _M32) ^ sample_keys)
    mixed = hash32((mixed + sample_keys) & _M32)
    return (mixed >= int(p * 2**32)).view(shape)


def resolve_rng_mode(mode: str, device: torch.device) -> str:
    """parallel.rng: auto -> fast on an accelerator, exact on the CPU (where exactness is what
    is checked and the per-sample streams cost little next to the matmuls)."""
    if mode == "auto":
        return "exact" if device.type == "cpu" else "fast"
    if mode not in RNG_MODES:
        raise ValueError(f"parallel.rng={mode!r}: expected auto, exact or fast")
    return str(mode)


def rng_mode_line(requested: str, device_type: str) -> str:
    """The startup plan's line: which mode runs and why."""
    mode = resolve_rng_mode(requested, torch.device(device_type))
    why = f"auto on {device_type}" if requested == "auto" else "as set"
    what = (
        "layout-independent masks: any layout reproduces the TP=1 losses"
        if mode == "exact"
        else "Megatron-style streams per TP rank, attention dropout inside the fused SDPA kernel"
    )
    return f"randomness: parallel.rng={mode} ({why}); {what}"


def _default_generator(device: torch.device) -> torch.Generator:
    if device.type == "cpu":
        return torch.default_generator
    index = device.index if device.index is not None else torch.cuda.current_device()
    return torch.cuda.default_generators[index]


class RNGTracker:
    """Holds the seed, the mode and the current (step, first global sample) of the micro-batch.

    `stream_rank` (fast mode) is this rank's position in the TP group and `context_rank` its CP
    rank: they key the attention dropout's generator stream (`forked`), so each rank's heads
    and positions get their own; the hash masks need neither (they are keyed by global
    position).

    NOTE: the training loop calls `set_position(step, sample_offset)` before every micro-batch;
    without it every forward redraws the masks of position (0, 0).
    """

    def __init__(
        self,
        seed: int,
        mode: str = "exact",
        stream_rank: int = 0,
        context_rank: int = 0,
        device: torch.device | str = "cpu",
    ) -> None:
        if mode not in RNG_MODES:
            raise ValueError(f"RNGTracker mode {mode!r}: expected one of {RNG_MODES}")
        self.seed = seed
        self.mode = mode
        self.stream_rank = stream_rank
        self.context_rank = context_rank
        """fast mode: this rank's CP rank, in every key (its chunk of the sequence is its own,
        in replicated regions too)."""
        self.step = 0
        self.sample_offset = 0
        self.mask_width = 0
        """The widest micro-batch (tokens) of the current global step, set by the training loop:
        attention masks are drawn at this width, so they do not depend on a micro-batch's own
        padding (see ParallelDropout)."""
        self._generators: dict[torch.device, torch.Generator] = {}
        self.device = torch.device(device)
        self.step_key, self.first_sample = self._position_tensors()

    def set_position(self, step: int, sample_offset: int = 0) -> None:
        """Key the masks of the next forward by the step and the global index of its first
        sample."""
        self.step, self.sample_offset = step, sample_offset
        self.step_key, self.first_sample = self._position_tensors()

    def _position_tensors(self) -> tuple[Tensor, Tensor]:
        """fast mode's position as graph inputs (see keep_mask): new tensors rather than
        written in place, so a backward that recomputes a mask from the old ones (a compiled
        graph may) still finds them. torch.full passes the value as a kernel argument."""
        if not self.fast:
            return _NO_POSITION, _NO_POSITION
        step_key = derive_seed(self.seed, self.step) & _M32
        return (
            torch.full((), step_key, dtype=torch.int64, device=self.device),
            torch.full((), self.sample_offset, dtype=torch.int64, device=self.device),
        )

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

    @property
    def fast(self) -> bool:
        return self.mode == "fast"

    @contextmanager
    def forked(self, device: torch.device, site: int) -> Iterator[None]:
        """fast mode: inside, `device`'s default generator (what the fused SDPA kernels draw
        from) is seeded by this call's key, which includes this rank's TP rank (each rank draws
        for its own heads) and CP rank; its previous state is back after. The meta device (a
        dry run) draws nothing and has no generator."""
        if device.type == "meta":
            yield
            return
        gen = _default_generator(device)
        saved = gen.get_state()  # host-side: CUDA keeps (seed, offset) on the CPU
        keys: tuple[int, ...] = (self.seed, self.step, self.sample_offset, site, self.stream_rank)
        if self.context_rank:  # CP rank 0 keeps the keys of a run without CP
            keys = (*keys, self.context_rank)
        gen.manual_seed(derive_seed(*keys))
        try:
            yield
        finally:
            gen.set_state(saved)

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
        self.seed = state["seed"]
        self.set_position(state["step"], state["sample_offset"])
        self.mask_width = state.get("mask_width", 0)
