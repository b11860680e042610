"""What the parallel machinery knows of a parameter beyond its tensor, as one typed record.

The layer or pipeline stage that creates a parameter says how it is laid out (`mark_sharded`,
`mark_sequence_parallel`, `set_init` in parallel/init.py; `mark_pipeline_tied` in
pipeline/stage.py); initialization, the engine (buckets, gradient sums, norm, compression),
checkpoints and export read it back with `param_info`. The record rides on the parameter
itself, so it survives the engine turning parameters into views of its flat buffers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import Tensor

InitMethod = Callable[[Tensor, torch.Generator], None]

_ATTRIBUTE = "tpformer_param_info"


@dataclass(frozen=True)
class ParamInfo:
    """tp_dim: the dim split across the TP group (None: replicated); logical_size: the unpadded
    size of that dim (the vocabulary is padded to a multiple of TP); sequence_parallel: acts on
    sequence-sharded activations, so its gradient is summed over TP; pipeline_tied: held by the
    first and the last pipeline stage (the tied word embedding), its gradient summed over the
    two; counted_in_norm: False on the tied copy the clipping norm must not count twice;
    pipeline_copy: the last stage's own copy of a tied parameter under pipedream (trained on
    its own; checkpoints write the first stage's); init: its own initialization instead of the
    default."""

    tp_dim: int | None = None
    logical_size: int | None = None
    sequence_parallel: bool = False
    pipeline_tied: bool = False
    counted_in_norm: bool = True
    pipeline_copy: bool = False
    init: InitMethod | None = None

    def logical_shape(self, local: torch.Size) -> torch.Size:
        """The full, unpadded shape of which a tensor of shape `local` is one TP chunk."""
        if self.tp_dim is None or self.logical_size is None:
            return local
        shape = list(local)
        shape[self.tp_dim] = self.logical_size
        return torch.Size(shape)


_PLAIN = ParamInfo()


def param_info(param: Tensor) -> ParamInfo:
    """The parameter's record (a replicated, unmarked one when nothing was said of it)."""
    info = getattr(param, _ATTRIBUTE, _PLAIN)
    assert isinstance(info, ParamInfo)
    return info


def update_param_info(param: Tensor, **changes: Any) -> None:
    """Set fields of the parameter's record (a TypeError names a field that does not exist)."""
    setattr(param, _ATTRIBUTE, replace(param_info(param), **changes))


def copy_param_info(source: Tensor, target: Tensor) -> Tensor:
    """`target` laid out as `source` (a meta stand-in for a checkpoint template)."""
    setattr(target, _ATTRIBUTE, param_info(source))
    return target
