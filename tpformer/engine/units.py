"""The units a model names for the engine: its repeated blocks, in forward order.

A model that defines `blocks()` (a list of modules, e.g. its transformer layers) gets one ZeRO
bucket and one recomputation unit per block, and one bucket for every other parameter; a model
without it is one bucket. A parameter that pipeline ends share (the tied word embedding) gets a
bucket of its own, so the first and last stage hold identical flat layouts of it. This is the
whole contract between the engine and a model, so the engine wraps any nn.Module and imports no
layer or model class.

With a size cap (parallel.bucket_mb) a unit's parameters are split, in their order, into
buckets of at most that many elements (a larger parameter is a bucket of its own), each keeping
the block as its module: gradients are reduced, and whole gradient buffers held, bucket by
bucket, while ZeRO-3 still gathers all of a block's buckets for its forward and backward.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import nn

from tpformer.parallel.param_info import param_info


def model_blocks(model: nn.Module) -> list[nn.Module]:
    """model.blocks(), or [] for a model that names none."""
    blocks = getattr(model, "blocks", None)
    return list(blocks()) if callable(blocks) else []


@dataclass
class Unit:
    """Parameters the engine keeps in one flat bucket; module None = every parameter outside
    the blocks (embeddings, heads, final norms), the "root" unit."""

    module: nn.Module | None
    params: list[tuple[str, nn.Parameter]]
    tied: bool = False
    """The parameters both pipeline ends hold (laid out alike on both: never cut)."""


def bucket_elements(bucket_mb: float) -> int:
    """Elements of fp32 gradient in a bucket of parallel.bucket_mb MiB (0: no cap)."""
    return int(bucket_mb * 2**20) // 4


def split_units(model: nn.Module, max_elements: int = 0) -> list[Unit]:
    """One unit per block, then the pipeline-tied unit and the root unit (if they have
    parameters); with `max_elements` > 0 the block and root units are cut into pieces of at
    most that many elements (see the module docstring)."""
    names = {id(m): n for n, m in model.named_modules()}
    units: list[Unit] = []
    in_block: set[int] = set()
    for block in model_blocks(model):
        params = [(f"{names[id(block)]}.{n}", p) for n, p in block.named_parameters()]
        in_block.update(id(p) for _, p in params)
        units.append(Unit(block, params))
    rest = [(n, p) for n, p in model.named_parameters() if id(p) not in in_block]
    tied = [(n, p) for n, p in rest if param_info(p).pipeline_tied]
    if tied:
        units.append(Unit(None, tied, tied=True))
    rest = [(n, p) for n, p in rest if not param_info(p).pipeline_tied]
    if rest:
        units.append(Unit(None, rest))
    units = [u for u in units if u.params]
    if max_elements > 0:
        units = [piece for u in units for piece in _cut(u, max_elements)]
    return units


def _cut(unit: Unit, max_elements: int) -> list[Unit]:
    """`unit` in consecutive pieces of at most max_elements (the tied unit stays whole)."""
    if unit.tied:
        return [unit]
    pieces: list[Unit] = []
    size = 0
    for name, p in unit.params:
        if not pieces or size + p.numel() > max_elements:
            pieces.append(Unit(unit.module, []))
            size = 0
        pieces[-1].params.append((name, p))
        size += p.numel()
    return pieces
