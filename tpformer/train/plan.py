"""The startup plan: layout, parameters per rank and a memory model per rank."""

from __future__ import annotations

from dataclasses import dataclass

from tpformer.config.schema import Config
from tpformer.engine.memory import MemoryBytes, zero_memory_bytes
from tpformer.engine.precision import DTYPES
from tpformer.parallel.layout import Layout



@dataclass(frozen=True)
class MemoryEstimate:
    model_state: MemoryBytes
    activations: int

    @property
    def total(self) -> int:
        return self.model_state.total + self.activations


def activation_bytes(config: Config, tp: int) -> int:
    """Activations kept for backward per rank per micro-batch (Korthikanti et al. 2022, scaled
    to the compute dtype): sbh(10 + 24/t + 5as/(ht)) per layer for 16-bit; selective drops the
    5as/(ht) attention term, full keeps only each checkpointed layer's input."""
    m, p = config.model, config.parallel
    s, b, h, a = config.data.seq_length, config.trainer.micro_batch_size, m.hidden_size, m.num_heads
    scale = DTYPES[p.precision].itemsize / 2
    layer = s * b * h * (10 + 24 / tp + (0 if p.activation_checkpointing == "selective"
                                         else 5 * a * s / (h * tp)))
    if p.activation_checkpointing == "full":
        wrapped = len(range(0, p.checkpoint_num_layers or m.num_layers, p.checkpoint_every))
        total = wrapped * 2 * s * b * h + (m.num_layers - wrapped) * layer
    else:
        total = m.num_layers * layer
    return int(total * scale)


def estimate_memory(config: Config, layout: Layout, params_per_rank: int) -> MemoryEstimate:
    p = config.parallel
    state = zero_memory_bytes(p.zero_stage, params_per_rank, layout.dp,
                              param_bytes=DTYPES[p.precision].itemsize, mixed=p.precision != "fp32")
    return MemoryEstimate(state, activation_bytes(config, layout.tp))


def format_plan(config: Config, layout: Layout, params_per_rank: int, total_params: int,
                checkpointed: list[str]) -> str:
    est = estimate_memory(config, layout, params_per_rank)
    t = config.trainer
    mb = 2**20
    global_batch = t.micro_batch_size * t.grad_accum * layout.dp
    lines = [
        f"layout: world {layout.world_size} = dp {layout.dp} x tp {layout.tp}",
        f"  TP groups: {layout.tp_groups()}",
        f"  DP groups: {layout.dp_groups()}",
        f"model: {config.model.arch} {config.model.num_layers} layers, hidden "
        f"{config.model.hidden_size}, {config.model.num_heads} heads; {total_params:,} parameters, "
        f"{params_per_rank:,} per rank",
        f"batch: global {global_batch} = micro {t.micro_batch_size} x accum {t.grad_accum} x dp "
        f"{layout.dp}, seq {config.data.seq_length}",
        f"engine: zero_stage {config.parallel.zero_stage}, cpu_offload "
        f"{config.parallel.cpu_offload}, precision {config.parallel.precision}, "
        f"checkpointing {config.parallel.activation_checkpointing} ({len(checkpointed)} wrapped)",
        f"memory per rank (estimate): params {est.model_state.params / mb:.1f} MB, grads "
        f"{est.model_state.grads / mb:.1f} MB, optimizer {est.model_state.optimizer / mb:.1f} MB, "
        f"activations {est.activations / mb:.1f} MB, total {est.total / mb:.1f} MB",
    ]
    return "\n".join(lines)
