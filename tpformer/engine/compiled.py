"""trainer.compile: torch.compile of each block's forward, the unit recomputation, ZeRO and the
pipeline already know.

Order (parallelize): the pipeline keeps this rank's stage, then each remaining block's forward
is compiled, then recomputation wraps it (full: the checkpoint around the compiled forward, so
a recomputation re-runs the compiled code), then the engine flattens the parameters and adds its
hooks. The engine's hooks sit on the block modules and the parameters, outside the compiled
function, so ZeRO-3's gathers and the gradient reduction run as in eager mode. The dropout draws
and selective recomputation's wrapper of the attention core (marked with
tpformer.parallel.random.eager_island) are wrapped with torch.compiler.disable after
recomputation, and run eagerly between the compiled graphs: masks stay the eager ones, so
compiled and eager runs give the same losses.
"""

from __future__ import annotations

import torch
from torch import nn

from tpformer.engine.units import model_blocks
from tpformer.parallel.random import EAGER_ISLAND


def apply_compile(model: nn.Module) -> None:
    """Replace each block's forward by its torch.compile'd version (inductor): compiled at the
    first call, from then on reused by every block of the same shape."""
    for block in model_blocks(model):
        block.forward = torch.compile(block.forward)


def isolate_eager_islands(model: nn.Module) -> None:
    """Wrap every method marked `eager_island` (on a module's class, or set on the module, as
    selective recomputation sets its wrapper) with torch.compiler.disable, on the module itself;
    run after recomputation has wrapped its targets."""
    for module in model.modules():
        methods = {
            attr
            for cls in type(module).__mro__
            for attr, value in vars(cls).items()
            if getattr(value, EAGER_ISLAND, False)
        }
        methods |= {
            attr
            for attr, value in vars(module).items()
            if callable(value) and getattr(value, EAGER_ISLAND, False)
        }
        for attr in sorted(methods):
            setattr(module, attr, torch.compiler.disable(getattr(module, attr), recursive=True))
