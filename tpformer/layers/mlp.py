"""The feed-forward block: column -> activation -> row (one all-reduce each way), or gated
(SwiGLU, GeGLU): act(x W_gate) * (x W_up) -> row."""

from __future__ import annotations

from torch import Tensor, nn

from tpformer.layers.linear import ColumnParallelLinear, RowParallelLinear
from tpformer.parallel.handle import GroupHandle


def activation_fn(name: str) -> nn.Module:
    """gelu (erf form, BERT), gelu_tanh (GPT-2's gelu_new) or silu (Llama's SwiGLU)."""
    if name == "silu":
        return nn.SiLU()
    return nn.GELU(approximate="tanh" if name == "gelu_tanh" else "none")


class ParallelMLP(nn.Module):
    """[b, s, hidden] -> [b, s, hidden] ([b, s/tp, hidden] both sides with sequence_parallel);
    the intermediate activations are sharded over TP.

    Gated: one column-parallel projection of 2 x intermediate rows laid out as [unit, (gate,
    up)], so a contiguous TP slice holds the gate and the up row of each of its units, in one
    matmul (and one sequence gather under SP)."""

    def __init__(
        self,
        hidden_size: int,
        intermediate_size: int,
        tp: GroupHandle,
        *,
        activation: str = "gelu",
        sequence_parallel: bool = False,
        gated: bool = False,
        bias: bool = True,
    ) -> None:
        super().__init__()
        self.gated = gated
        self.fc_in = ColumnParallelLinear(
            hidden_size,
            (2 if gated else 1) * intermediate_size,
            tp,
            sequence_parallel=sequence_parallel,
            bias=bias,
        )
        self.act = activation_fn(activation)
        self.fc_out = RowParallelLinear(
            intermediate_size, hidden_size, tp, sequence_parallel=sequence_parallel, bias=bias
        )

    def forward(self, x: Tensor) -> Tensor:
        y = self.fc_in(x)
        if self.gated:
            gate, up = y.unflatten(-1, (-1, 2)).unbind(-1)
            return self.fc_out(self.act(gate) * up)
        return self.fc_out(self.act(y))
