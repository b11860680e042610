"""TPModule: a module that owns a TP handle and can load or emit full (unsharded) state."""

from __future__ import annotations

from collections.abc import Mapping

from torch import Tensor, nn

from tpformer.parallel.handle import GroupHandle
from tpformer.parallel.init import full_state_dict, load_full_state_dict


class TPModule(nn.Module):
    """Base of the parallel layers and models: `load_full_state_dict` keeps this rank's slices."""

    tp: GroupHandle

    def load_full_state_dict(self, state: Mapping[str, Tensor]) -> None:
        """Load an unsharded state dict (e.g. of the nn.Linear or TP=1 model it mirrors)."""
        load_full_state_dict(self, state, self.tp)

    def full_state_dict(self) -> dict[str, Tensor]:
        """The unsharded state dict; all-gathers each sharded parameter over the TP group."""
        return full_state_dict(self, self.tp)
