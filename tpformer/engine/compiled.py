"""trainer.compile: torch.compile of each block's forward, the unit recomputation, ZeRO and the
pipeline already know.

Order (parallelize): the pipeline keeps this rank's stage, then each remaining block's forward
is compiled, then recomputation wraps it (full: the checkpoint around the compiled forward, so
a recomputation re-runs the compiled code), then the engine flattens the parameters and adds its
hooks. The engine's hooks sit on the block modules and the parameters, outside the compiled
function, so ZeRO-3's gathers and the gradient reduction run as in eager mode. The dropout draws
and selective recomputation's wrapper of the attention core run eagerly between the compiled
graphs (tpformer.parallel.random.eager_island): masks stay the eager ones, so compiled and eager
runs give the same losses.
"""

from __future__ import annotations

import torch
from torch import nn

from tpformer.engine.units import model_blocks


def apply_compile(model: nn.Module) -> None:
    """Replace each block's forward by its torch.compile'd version (inductor): compiled at the
    first call, from then on reused by every block of the same shape."""
    for block in model_blocks(model):
        block.forward = torch.compile(block.forward)
