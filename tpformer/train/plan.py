"""The startup plan: layout, parameters per rank and a memory model per rank."""

from __future__ import annotations

from dataclasses import dataclass

from tpformer.config.schema import Config
from tpformer.engine.memory import MemoryBytes, zero_memory_bytes
from tpformer.engine.precision import DTYPES
from tpformer.parallel.layout import Layout
from tpformer.parallel.pipeline.schedule import simulate
from tpformer.parallel.pipeline.split import SplitChoice



@dataclass(frozen=True)
class MemoryEstimate:
    model_state: MemoryBytes
    activations: int

    @property
    def total(self) -> int:
        return self.model_state.total + self.activations


def layer_activation_bytes(s: int, b: int, h: int, a: int, f: int, *, tp: int,
                           sequence_parallel: bool, recompute: str, itemsize: int) -> float:
    """Bytes one transformer layer keeps for backward on one rank (Korthikanti et al. 2022, with
    tensors of `itemsize` bytes, 1-byte dropout masks and FFN width f). Kept tensors, in
    elements: LayerNorm inputs 2sbh, QKV and MLP inputs 2sbh (replicated under TP, 1/t of the
    sequence under sequence parallelism); q, k, v 3sbh, attention output sbh, GELU input and
    output 2sbf (1/t under TP); softmax output and its dropout 2as^2b (1/t); masks 2sbh + as^2b
    bytes. 16-bit, f = 4h: sbh(10 + 24/t + 5as/(ht)), with SP sbh/t (34 + 5as/h), SP + selective
    34 sbh/t. selective drops the as^2 terms; full keeps only the layer's input."""
    q = tp if sequence_parallel else 1  # what the LayerNorm/dropout/residual region is split by
    sbh, attention = s * b * h, a * s * s * b
    if recompute == "full":
        return itemsize * sbh / q
    kept = itemsize * (4 * sbh / q + (4 * sbh + 2 * s * b * f) / tp) + 2 * sbh / q
    if recompute != "selective":
        kept += (2 * itemsize + 1) * attention / tp
    return kept


def activation_bytes(config: Config, tp: int) -> int:
    """Activations kept for backward per rank per micro-batch by the transformer layers
    (`layer_activation_bytes` each; full recomputation: the wrapped layers keep their input)."""
    m, p = config.model, config.parallel
    shape = (config.data.seq_length, config.trainer.micro_batch_size, m.hidden_size, m.num_heads,
             m.intermediate_size)

    def layer(recompute: str) -> float:
        return layer_activation_bytes(*shape, tp=tp, sequence_parallel=p.sequence_parallel,
                                      recompute=recompute, itemsize=DTYPES[p.precision].itemsize)

    if p.activation_checkpointing == "full":
        wrapped = len(range(0, p.checkpoint_num_layers or m.num_layers, p.checkpoint_every))
        total = wrapped * layer("full") + (m.num_layers - wrapped) * layer("none")
    else:
        total = m.num_layers * layer(p.activation_checkpointing)
    return int(total)


def estimate_memory(config: Config, layout: Layout, params_per_rank: int) -> MemoryEstimate:
    p = config.parallel
    state = zero_memory_bytes(p.zero_stage, params_per_rank, layout.dp,
                              param_bytes=DTYPES[p.precision].itemsize, mixed=p.precision != "fp32")
    return MemoryEstimate(state, activation_bytes(config, layout.tp))


def pipeline_lines(config: Config, layout: Layout, stage_params: list[int],
                   choice: SplitChoice) -> list[str]:
    """The split, each stage's predicted time, the bubble and memory per stage."""
    p, t = config.parallel, config.trainer
    chunks = len(choice.split) // layout.pp
    costs = choice.stage_costs(layout.pp)
    per_virtual = choice.costs.of_split(choice.split)
    # the simulation's forward = 1/3 of forward+backward (backward twice the forward)
    sim = simulate(p.pipeline_schedule, layout.pp, t.grad_accum, chunks,
                   forward_time=[c / 3 for c in per_virtual])
    ideal = t.grad_accum * max(costs)
    layer = activation_bytes(config, layout.tp) / config.model.num_layers
    mb = 2**20
    lines = [f"pipeline: {layout.pp} stages, schedule {p.pipeline_schedule}"
             + (f" x {chunks} virtual" if chunks > 1 else "")
             + f", {t.grad_accum} micro-batches; split {choice.split} "
             f"(pipeline_split={p.pipeline_split})",
             f"  PP groups: {layout.pp_groups()}",
             f"  predicted bubble {sim.bubble:.1%}; step {sim.makespan:.3g} {choice.unit} vs "
             f"{ideal:.3g} without bubble ((m + p - 1) / m = "
             f"{(t.grad_accum + layout.pp - 1) / t.grad_accum:.2f})"]
    for r in range(layout.pp):
        layers = sum(choice.split[r::layout.pp])
        state = estimate_memory(config, layout, stage_params[r]).model_state
        act = layers * layer * sim.peak_in_flight[r]
        lines.append(f"  stage {r}: {layers} layers, {costs[r]:.3g} {choice.unit} per micro-batch, "
                     f"{sim.peak_in_flight[r]} micro-batches in flight, memory per rank "
                     f"{(state.total + act) / mb:.1f} MB ({stage_params[r]:,} parameters, "
                     f"activations {act / mb:.1f} MB)")
    return lines


def format_plan(config: Config, layout: Layout, stage_params: list[int], total_params: int,
                checkpointed: list[str], split: SplitChoice | None = None) -> str:
    """The startup plan; `stage_params`: parameters per rank on each pipeline stage."""
    params_per_rank = stage_params[0]
    est = estimate_memory(config, layout, params_per_rank)
    t = config.trainer
    mb = 2**20
    global_batch = t.micro_batch_size * t.grad_accum * layout.dp
    pp = f"pp {layout.pp} x " if layout.pp > 1 else ""
    lines = [
        f"layout: world {layout.world_size} = {pp}dp {layout.dp} x tp {layout.tp}",
        f"  TP groups: {layout.tp_groups()}",
        f"  DP groups: {layout.dp_groups()}",
        *(pipeline_lines(config, layout, stage_params, split) if split is not None else []),
        f"model: {config.model.arch} {config.model.num_layers} layers, hidden "
        f"{config.model.hidden_size}, {config.model.num_heads} heads; {total_params:,} parameters, "
        f"{params_per_rank:,} per rank" + (" (stage 0)" if layout.pp > 1 else ""),
        f"batch: global {global_batch} = micro {t.micro_batch_size} x accum {t.grad_accum} x dp "
        f"{layout.dp}, seq {config.data.seq_length}",
        f"engine: zero_stage {config.parallel.zero_stage}, cpu_offload "
        f"{config.parallel.cpu_offload}, precision {config.parallel.precision}, "
        f"checkpointing {config.parallel.activation_checkpointing} ({len(checkpointed)} wrapped), "
        f"sequence_parallel {str(config.parallel.sequence_parallel).lower()}",
        f"memory per rank (estimate): params {est.model_state.params / mb:.1f} MB, grads "
        f"{est.model_state.grads / mb:.1f} MB, optimizer {est.model_state.optimizer / mb:.1f} MB, "
        f"activations {est.activations / mb:.1f} MB, total {est.total / mb:.1f} MB",
    ]
    return "\n".join(lines)
