"""trainer.compile: torch.compile of each block's forward, the unit recomputation, ZeRO and the
pipeline already know.

Order (parallelize): the pipeline keeps this rank's stage, then each remaining block's forward
is compiled, then recomputation wraps it (full: the checkpoint around the compiled forward, so
a recomputation re-runs the compiled code), then the engine flattens the parameters and adds its
hooks. The engine's hooks sit on the block modules and the parameters, outside the compiled
function, so ZeRO-3's gathers and the gradient reduction run as in eager mode.

Randomness (tpformer/parallel/random.py). Under parallel.rng=fast a block is one graph: its
dropout masks are integer hashes computed inside the graph, and the attention dropout is drawn by
SDPA's kernel from the device's default generator, which the wrapper here seeds with the
attention's key before the compiled block runs (the kernel is the block's only draw from it), as
the eager attention seeds it around its SDPA call: compiled and eager runs draw the same masks.
Inductor's `fallback_random` keeps that draw the eager op's on the CPU too (its math SDPA would
otherwise take inductor's own RNG). Under exact, the per-sample draws and selective
recomputation's wrapper of the attention core (marked with tpformer.parallel.random.eager_island)
are wrapped with torch.compiler.disable after recomputation and run eagerly between graphs.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from typing import Any

import torch
from torch import nn

from tpformer.engine.units import model_blocks
from tpformer.engine.wrapping import wrap_method
from tpformer.parallel.random import EAGER_ISLAND, DeviceStreamUser, RNGTracker


def apply_compile(model: nn.Module, rng: RNGTracker) -> None:
    """Run each block's forward as its torch.compile'd version (inductor), seeded for its
    attention dropout under fast mode: compiled at the first call, from then on reused by every
    block of the same shape."""
    import torch._inductor.config as inductor_config  # here: a run without compile skips it

    inductor_config.fallback_random = True
    for block in model_blocks(model):
        wrap_method(block, "forward", _compiled(block, rng), "Compiled")


def _compiled(block: nn.Module, rng: RNGTracker) -> Callable[[Callable[..., Any]], Any]:
    """forward -> its torch.compile'd version, seeded for the block's device draw."""

    def compile_forward(forward: Callable[..., Any]) -> Callable[..., Any]:
        return _seeded(block, torch.compile(forward), rng)

    return compile_forward


def _seeded(block: nn.Module, forward: Callable[..., Any], rng: RNGTracker) -> Callable[..., Any]:
    """`forward` with the device's default generator seeded by the key of the block's one draw
    from it (fast mode's attention dropout), read at each call (eval and exact draw nothing)."""
    users = [m for m in block.modules() if isinstance(m, DeviceStreamUser)]
    if len(users) > 1:
        raise NotImplementedError(
            f"trainer.compile seeds one device-generator draw per block; {type(block).__name__} "
            f"has {len(users)} ({', '.join(type(m).__name__ for m in users)})"
        )

    def run(*args: Any, **kwargs: Any) -> Any:
        site = users[0].device_stream_site() if users and block.training else None
        stream = nullcontext() if site is None else rng.forked(rng.device, site)
        with stream:
            return forward(*args, **kwargs)

    return run


def isolate_eager_islands(model: nn.Module) -> None:
    """Wrap every method marked `eager_island` (on a module's class, including the class
    selective recomputation gave its target) with torch.compiler.disable (engine/wrapping.py);
    run after recomputation has wrapped its targets."""
    for module in list(model.modules()):
        methods = {
            attr
            for cls in type(module).__mro__
            for attr, value in vars(cls).items()
            if getattr(value, EAGER_ISLAND, False)
        }
        for attr in sorted(methods):
            wrap_method(
                module,
                attr,
                lambda fn: torch.compiler.disable(fn, recursive=True),
                "Eager",
            )
