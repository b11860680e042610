"""One pipeline stage of a model: its chunks of blocks, the embedding on the first stage, the
output head on the last, and nothing else.

A pipelined model names its parts (BERT and GPT do): `embed(**batch)` (the first stage's
work), `block_mask(**batch)` and `block_positions(**batch)` (what every block gets beside the
activation: its attention mask and packed documents' positions), `head(x, **batch)`
(the last stage's work), `blocks()`, and the module prefixes `pipeline_embedding` and
`pipeline_head` those parts use; `pipeline_tied` names parameters both ends use (the word
embedding that is also the output projection). The model is built whole on every stage, with
the layout-independent initialization, and every parameter another stage owns is dropped, so
each stage holds exactly the TP=1 model's values of its own parameters.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any, Protocol, cast

from torch import Tensor, nn

from tpformer.parallel.param_info import update_param_info
from tpformer.parallel.pipeline.schedule import virtual_stage


class PipelinedModel(Protocol):
    """What a model offers the pipeline (see the module docstring); `pipelined` checks it."""

    pipeline_embedding: tuple[str, ...]
    pipeline_head: tuple[str, ...]

    def embed(self, **batch: Any) -> Tensor: ...

    def block_mask(self, **batch: Any) -> Tensor | None: ...

    def block_positions(self, **batch: Any) -> Tensor | None: ...

    def head(self, x: Tensor, **batch: Any) -> Any: ...

    def blocks(self) -> list[nn.Module]: ...


PIPELINE_METHODS = ("embed", "block_mask", "block_positions", "head", "blocks")
PIPELINE_NAMES = ("pipeline_embedding", "pipeline_head")


def pipelined(model: nn.Module) -> PipelinedModel:
    """The model as the pipeline uses it, checked once: every missing part is named."""
    missing = [f"{m}()" for m in PIPELINE_METHODS if not callable(getattr(model, m, None))]
    missing += [n for n in PIPELINE_NAMES if not isinstance(getattr(model, n, None), tuple)]
    if missing:
        raise ValueError(
            f"{type(model).__name__} cannot be pipelined (parallel.pipeline > 1): it lacks "
            f"{', '.join(missing)}; a pipelined model defines {', '.join(PIPELINE_METHODS)} and "
            f"names its parts in {', '.join(PIPELINE_NAMES)} (optionally pipeline_tied)"
        )
    return cast(PipelinedModel, model)


def mark_pipeline_tied(param: nn.Parameter, *, counted: bool) -> None:
    """A parameter held by the first and the last stage: its gradient is summed over the two
    before the update (its own ZeRO bucket, so both ends' shards line up), and the norm counts
    it once (`counted` on the first stage only)."""
    update_param_info(param, pipeline_tied=True, counted_in_norm=counted)


@dataclass
class PipelineStage:
    """This rank's share of the model: `chunks[c]` are the blocks of virtual stage c*p + rank."""

    model: PipelinedModel
    chunks: list[list[nn.Module]]
    rank: int
    stages: int

    @property
    def virtual_stages(self) -> int:
        return self.stages * len(self.chunks)

    def is_first(self, chunk: int) -> bool:
        return virtual_stage(chunk, self.rank, self.stages) == 0

    def is_last(self, chunk: int) -> bool:
        return virtual_stage(chunk, self.rank, self.stages) == self.virtual_stages - 1

    def forward(self, chunk: int, x: Tensor | None, batch: dict[str, Tensor]) -> Tensor:
        """Virtual stage `chunk`'s blocks on x (the embedding first, on virtual stage 0)."""
        if self.is_first(chunk):
            x = self.model.embed(**batch)
        assert x is not None, "a virtual stage after the first receives its input"
        mask, positions = self.model.block_mask(**batch), self.model.block_positions(**batch)
        for block in self.chunks[chunk]:
            x = block(x, mask, None, positions)
        return x

    def head(self, x: Tensor, batch: dict[str, Tensor]) -> object:
        """The model's output on the last virtual stage (what its forward returns)."""
        return self.model.head(x, **batch)


def split_bounds(split: list[int]) -> list[tuple[int, int]]:
    """[start, stop) of each (virtual) stage's layers."""
    starts = [sum(split[:i]) for i in range(len(split) + 1)]
    return list(itertools.pairwise(starts))


def build_stage(
    model: nn.Module, split: list[int], rank: int, stages: int, *, tie_ends: bool = True
) -> PipelineStage:
    """Keep this rank's parameters of `model` (split: layers per virtual stage, len p x v).
    `tie_ends=False` (pipedream): the last stage's copy of a tied parameter trains on its own
    and is marked `pipeline_copy` (checkpoints keep the first stage's)."""
    parts = pipelined(model)
    blocks = list(parts.blocks())
    if sum(split) != len(blocks) or len(split) % stages:
        raise ValueError(
            f"pipeline split {split} does not cover the model's {len(blocks)} "
            f"blocks in a multiple of {stages} stages"
        )
    bounds = split_bounds(split)
    chunks = [
        blocks[slice(*bounds[virtual_stage(c, rank, stages)])] for c in range(len(split) // stages)
    ]
    if stages == 1:
        return PipelineStage(parts, chunks, rank, stages)
    first, last = rank == 0, rank == stages - 1
    kept = {id(p) for chunk in chunks for b in chunk for p in b.parameters()}
    named = dict(model.named_modules())
    tied = set(getattr(model, "pipeline_tied", ()))
    for prefix, keep in ((parts.pipeline_embedding, first), (parts.pipeline_head, last)):
        for name in prefix:
            if keep:
                kept.update(id(p) for p in _module_params(model, named, name))
    for name, param in model.named_parameters():
        if name in tied and (first or last):
            kept.add(id(param))
            if tie_ends:
                mark_pipeline_tied(param, counted=first)
            elif last and not first:
                update_param_info(param, pipeline_copy=True)
    owned_anywhere = {id(p) for b in blocks for p in b.parameters()}
    for prefixes in (parts.pipeline_embedding, parts.pipeline_head):
        for name in prefixes:
            owned_anywhere.update(id(p) for p in _module_params(model, named, name))
    stray = [n for n, p in model.named_parameters() if id(p) not in owned_anywhere]
    if stray:
        raise ValueError(
            f"{type(model).__name__}: parameters {stray} belong to no pipeline part "
            "(blocks, pipeline_embedding or pipeline_head)"
        )
    for module in model.modules():
        for pname, owned in list(module._parameters.items()):
            if owned is not None and id(owned) not in kept:
                module._parameters[pname] = None  # another stage's: dropped
    return PipelineStage(parts, chunks, rank, stages)


def _module_params(model: nn.Module, named: dict[str, nn.Module], name: str) -> list[nn.Parameter]:
    """The parameters under a module name, or the one parameter of that name."""
    if name in named:
        return list(named[name].parameters())
    params = dict(model.named_parameters())
    if name in params:
        return [params[name]]
    raise ValueError(f"{type(model).__name__} names pipeline part {name!r}, which it does not have")
