"""The feed-forward block: column -> activation -> row (one all-reduce each way)."""

from __future__ import annotations

from torch import Tensor, nn

from tpformer.layers.linear import ColumnParallelLinear, RowParallelLinear
from tpformer.parallel.context import GroupHandle


def activation_fn(name: str) -> nn.Module:
    """gelu (erf form, BERT) or gelu_tanh (GPT-2's gelu_new)."""
    return nn.GELU(approximate="tanh" if name == "gelu_tanh" else "none")


class ParallelMLP(nn.Module):
    """[b, s, hidden] -> [b, s, hidden] ([b, s/tp, hidden] both sides with sequence_parallel);
    the intermediate activations are sharded over TP."""

    def __init__(
        self,
        hidden_size: int,
        intermediate_size: int,
        tp: GroupHandle,
        *,
        activation: str = "gelu",
        sequence_parallel: bool = False,
    ) -> None:
        super().__init__()
        self.fc_in = ColumnParallelLinear(
            hidden_size, intermediate_size, tp, sequence_parallel=sequence_parallel
        )
        self.act = activation_fn(activation)
        self.fc_out = RowParallelLinear(
            intermediate_size, hidden_size, tp, sequence_parallel=sequence_parallel
        )

    def forward(self, x: Tensor) -> Tensor:
        return self.fc_out(self.act(self.fc_in(x)))
