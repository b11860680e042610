"""Step time of a layout: matmuls at the measured efficiency of their size, elementwise work at
memory bandwidth, TP collectives on the critical path, pipeline fill and drain, the part of the
data-parallel reduction backward does not hide, and the optimizer step."""

from __future__ import annotations

from dataclasses import dataclass

from tpformer.layers.embedding import padded_vocab_size
from tpformer.models.costs import attended_pairs, step_flops
from tpformer.parallel.sequence_chunks import within_reach
from tpformer.planner.candidate import Candidate, Workload
from tpformer.planner.cluster import Cluster
from tpformer.planner.layer_memory import LayerShape, layer_activation_bytes
from tpformer.planner.memory import (
    activation_parts,
    exact_attention_dropout,
    flash_windows,
    fused_attention,
    local_layers,
    rng_mode,
    stage_params,
)


@dataclass(frozen=True)
class TimePrediction:
    """Seconds per optimizer step, by part (compute and TP of the slowest stage per
    micro-batch, the pipeline's fill and drain, exposed DP and offload traffic, the step)."""

    step: float
    compute: float
    tensor_comm: float
    bubble: float
    data_comm: float
    optimizer: float
    model_flops: float
    """FLOPs of one step as the loop's MFU counts them (models/costs.py, no recomputation)."""

    def tokens_per_s(self, work: Workload) -> float:
        return work.global_batch * work.seq / self.step

    def mfu(self, cluster: Cluster) -> float:
        return self.model_flops / self.step / cluster.world_size / cluster.peak_flops


def layer_gemms(work: Workload, c: Candidate) -> list[tuple[float, float, float, float]]:
    """(m, n, k, batch) of one layer's forward GEMMs on one TP rank: QKV, attention output,
    FFN in and out ([tokens, k] @ [k, n]), then QK^T and PV batched over samples x heads. With
    context parallelism a rank holds s / cp tokens and its attention is cp blocks of
    [s / cp, s / cp] (one per ring step), of which a causal model (GPT) computes its own block
    and half of each other (the rest is all future): (cp + 1) / 2 blocks."""
    m, s, b, t, cp = work.model, work.seq / c.cp, c.micro_batch, c.tp, c.cp
    h, f, tokens = m.hidden_size, m.intermediate_size, s * b
    blocks = cp if m.arch == "bert" or cp == 1 else (cp + 1) / 2
    d, heads = h / m.num_heads, b * m.num_heads / t * blocks
    return [
        (tokens, 3 * h / t, h, 1),
        (tokens, h, h / t, 1),
        (tokens, f / t, h, 1),
        (tokens, h, f / t, 1),
        (s, s, d, heads),
        (s, d, s, heads),
    ]


def gemms_time(cl: Cluster, gemms: list, itemsize: int) -> tuple[float, float]:
    """(forward, backward) seconds of `gemms` ((m, n, k, batch) each) in training."""
    times = [cl.gemm_train_time(m, n, k, batch, itemsize) for m, n, k, batch in gemms]
    return sum(f for f, _ in times), sum(b for _, b in times)


def fp8_cast_bytes(work: Workload, c: Candidate) -> float:
    """Bytes one layer's fp8 casts move per micro-batch on one rank (an estimate, not yet
    measured on a GPU): each linear's input and output gradient read in the compute dtype and
    written as fp8, their transposed copies for the weight gradient, and each weight cast in
    forward and again in backward."""
    m, s, b, t = work.model, work.seq / c.cp, c.micro_batch, c.tp
    h, f, i = m.hidden_size, m.intermediate_size, work.itemsize
    shape = LayerShape.of(m, t)
    f_in = (2 if shape.gated else 1) * f
    activations = s * b * (h + h / t + h + f / t)  # the four linears' inputs
    grads = s * b * (3 * h / t + h + f_in / t + h)  # their output gradients
    weights = (4 * h * h + (f_in + f) * h) / t
    return (i + 1) * (activations + grads) + 2 * (activations + grads) + 2 * (i + 1) * weights


def local_core_share(work: Workload, c: Candidate, cl: Cluster) -> float:
    """The share of a global layer's attention GEMMs a local (sliding-window) layer runs: under
    context parallelism the ring blocks within the window's reach (the busiest rank's;
    parallel/sequence_chunks.within_reach); where flash runs the window, its band of
    (query, key) pairs (models/costs.attended_pairs); elsewhere all of them (a band mask over
    the dense scores)."""
    local = work.model.local_attention
    if local is None:
        return 1.0
    if c.cp > 1:
        held = work.seq // c.cp
        reached = (
            sum(within_reach(held, c.cp, rank, src, local.window // 2) for src in range(c.cp))
            for rank in range(c.cp)
        )
        return max(reached) / c.cp
    if flash_windows(work, fused_attention(work, cl)):
        return attended_pairs(work.seq, local.window) / work.seq**2
    return 1.0


def layer_time(work: Workload, c: Candidate, cl: Cluster, core_share: float = 1.0) -> float:
    """Forward + backward (+ recomputation) of one layer on one rank, per micro-batch; a local
    layer runs `core_share` of the attention GEMMs (local_core_share)."""
    gemms = layer_gemms(work, c)
    fused = fused_attention(work, cl) and c.cp == 1  # the ring's block core is explicit
    forward, backward = gemms_time(cl, gemms[:4], work.itemsize)
    if work.precision == "fp8":  # the blocks' linears (layers/fp8.py)
        forward, backward = forward / cl.fp8_speedup, backward / cl.fp8_speedup
        forward += fp8_cast_bytes(work, c) / cl.memory_bandwidth
    # a fused attention kernel keeps the scores on chip: its GEMMs are not bound by memory
    core_forward, core_backward = gemms_time(cl, gemms[4:], 0 if fused else work.itemsize)
    if c.cp > 1:  # ring attention's backward recomputes each block's scores (QK^T)
        core_backward += gemms_time(cl, gemms[4:5], work.itemsize)[0]
    core_forward, core_backward = core_share * core_forward, core_share * core_backward
    forward, backward = forward + core_forward, backward + core_backward
    shape = (
        work.seq,
        c.micro_batch,
        work.model.hidden_size,
        work.model.num_heads,
        work.model.intermediate_size,
    )
    touched = _touched_bytes(work, c, cl, shape, fused, "none")
    elementwise = cl.elementwise_passes * touched / cl.memory_bandwidth
    attention_noise, residual_noise = _dropout_noise(work, c, cl, fused)
    time = forward + backward + elementwise + cl.layer_overhead + attention_noise + residual_noise
    if c.recompute == "full":
        time += forward + (elementwise + cl.layer_overhead) / 3 + attention_noise + residual_noise
    elif c.recompute == "selective":
        without = _touched_bytes(work, c, cl, shape, fused, "selective")
        time += (
            core_forward  # QK^T and PV again
            + (elementwise / 3) * (touched - without) / touched
            + attention_noise
        )
    return time


def _touched_bytes(
    work: Workload,
    c: Candidate,
    cl: Cluster,
    shape: tuple[int, int, int, int, int],
    fused: bool,
    recompute: str,
) -> float:
    """Activation bytes one layer writes and reads (layer_activation_bytes at this layout),
    with attention dropout counted only when nothing is recomputed."""
    return layer_activation_bytes(
        *shape,
        tp=c.tp,
        sequence_parallel=c.sequence_parallel,
        recompute=recompute,
        itemsize=work.itemsize,
        mask_bytes=cl.mask_bytes,
        fused_attention=fused,
        context=c.cp,
        attention_dropout=recompute == "none" and exact_attention_dropout(work, cl),
        shape=LayerShape.of(work.model, c.tp),
        masked=work.padded,
    )  # fp8's 1-byte casts save memory, not elementwise work (their own: fp8_cast_bytes)


def _dropout_noise(work: Workload, c: Candidate, cl: Cluster, fused: bool) -> tuple[float, float]:
    """Seconds drawing dropout noise in one layer's forward: (attention probabilities, the two
    residual branches). exact: one stream per sample, which every rank draws whole (all heads,
    the whole sequence) and slices; fast: each rank draws its own part, and a fused attention
    kernel draws its own mask inside (context parallelism: exact draws the whole streams too;
    fast, this rank's part)."""
    m, exact = work.model, rng_mode(work, cl) == "exact"
    heads = m.num_heads if exact else m.num_heads / c.tp / c.cp
    attention = (
        heads * work.seq**2 * c.micro_batch * cl.dropout_time
        if m.attention_dropout > 0 and not fused
        else 0.0
    )
    split = 1 if exact else (c.tp if c.sequence_parallel else 1) * c.cp
    residual = (
        2 * work.seq * c.micro_batch * m.hidden_size / split * cl.dropout_time
        if m.dropout > 0
        else 0.0
    )
    return attention, residual


def tensor_comm_time(work: Workload, c: Candidate, cl: Cluster) -> float:
    """A layer's TP collectives per micro-batch on its activation: 2 all-reduces forward and 2
    backward; with sequence parallelism 2 all-gathers + 2 reduce-scatters forward and 2
    reduce-scatters + 4 all-gathers backward (1.5x the bytes; under fp8 four of the gathers
    carry 1-byte casts); a fully recomputed layer repeats its forward's."""
    if c.tp == 1:
        return 0.0
    nbytes = work.seq / c.cp * c.micro_batch * work.model.hidden_size * work.itemsize
    link, forwards = cl.link(c.tp), 2 if c.recompute == "full" else 1
    if not c.sequence_parallel:
        return (2 * forwards + 2) * link.all_reduce(nbytes, c.tp)
    gather, scatter = link.all_gather(nbytes, c.tp), link.reduce_scatter(nbytes, c.tp)
    # fp8: the QKV and MLP inputs are gathered as fp8 (forward, recomputed, backward's 2 of 4)
    inputs = link.all_gather(nbytes / work.itemsize, c.tp) if work.precision == "fp8" else gather
    return forwards * 2 * (inputs + scatter) + 2 * scatter + 2 * (gather + inputs)


def ring_block_elements(
    batch: int, heads: int, seq: int, hidden: int, *, tp: int, cp: int
) -> float:
    """Elements of one ring-attention transfer: this rank's keys and values, stacked,
    [2, b, heads / tp, s / cp, head_dim]."""
    return 2 * batch * heads / tp * seq / cp * hidden / heads


def ring_bytes_per_layer(
    batch: int, heads: int, seq: int, hidden: int, *, tp: int, cp: int, itemsize: int
) -> float:
    """Bytes one CP rank sends per layer (forward + backward): cp - 1 key/value blocks forward,
    cp - 1 again in backward, and cp blocks of their gradients (sent in fp32)."""
    if cp == 1:
        return 0.0
    block = ring_block_elements(batch, heads, seq, hidden, tp=tp, cp=cp)
    return 2 * (cp - 1) * block * itemsize + cp * block * 4


def context_comm_time(work: Workload, c: Candidate, cl: Cluster) -> float:
    """A layer's exposed ring traffic per micro-batch: each ring step sends one block of
    stacked keys and values (2 b (a / t) (s / cp) d x itemsize bytes) to the next CP rank
    while the rank computes its attention against the block it holds, so only what a step's
    transfer takes beyond that block's compute shows: cp - 1 steps forward, cp - 1 key/value
    and cp gradient transfers backward (the gradients in fp32)."""
    if c.cp == 1:
        return 0.0
    m = work.model
    block = ring_block_elements(
        c.micro_batch, m.num_heads, work.seq, m.hidden_size, tp=c.tp, cp=c.cp
    )
    link = cl.link(c.cp * c.tp)
    kv, grads = link.send(block * work.itemsize), link.send(block * 4)
    core_forward, core_backward = gemms_time(cl, layer_gemms(work, c)[4:], work.itemsize)
    step_forward, step_backward = core_forward / c.cp, core_backward / c.cp
    forward = (c.cp - 1) * max(0.0, kv - step_forward)
    backward = (c.cp - 1) * max(0.0, kv - step_backward) + c.cp * grads
    return forward + backward


def _ends_time(work: Workload, c: Candidate, cl: Cluster) -> tuple[float, float]:
    """(embedding, head) forward+backward per micro-batch on their stages."""
    m = work.model
    h = m.hidden_size
    _, embedding_bytes, head_bytes = activation_parts(work, c, mask_bytes=cl.mask_bytes)
    vocab = padded_vocab_size(m.vocab_size, c.tp, m.pad_vocab_to) // c.tp
    local = work.seq / c.cp  # this CP rank's tokens
    rows = local * c.micro_batch * work.head_fraction
    head = sum(cl.gemm_train_time(rows, vocab, h, itemsize=work.itemsize))
    if m.arch == "bert":
        head += sum(cl.gemm_train_time(rows, h, h, itemsize=work.itemsize))
    passes = cl.elementwise_passes / cl.memory_bandwidth
    embed_comm = cl.link(c.tp).all_reduce(local * c.micro_batch * h * work.itemsize, c.tp)
    # each end has about a layer's fixed cost (its kernels, the loss's collectives)
    noise = local * c.micro_batch * h * cl.dropout_time if m.dropout > 0 else 0.0
    return (
        embedding_bytes * passes + embed_comm + cl.layer_overhead + noise,
        head + head_bytes * passes + cl.layer_overhead,
    )


def _data_comm(work: Workload, c: Candidate, cl: Cluster, params: float, backward: float) -> float:
    """The DP traffic's exposed time per step. Gradients are reduced during backward (stages
    0-1 once, in the last micro-batch's; stages 2-3 in every micro-batch's), parameters
    gathered during forward (stages 1-2 once, the next step's first forward; stage 3 in every
    forward and again in every backward); `comm_overlap` of the compute alongside hides it."""
    dp = c.replicas  # gradients are reduced over DP x CP
    if dp == 1:
        return 0.0
    link = cl.link(dp * c.tp)
    grads = params * (2 if work.grad_compression in ("bf16", "powersgd") else 4)
    weights = params * work.itemsize
    behind_backward, behind_forward = cl.comm_overlap * backward, cl.comm_overlap * backward / 2

    def exposed(comm: float, hidden: float) -> float:
        return max(0.0, comm - hidden)

    if c.zero_stage == 0:
        return exposed(link.all_reduce(grads, dp), behind_backward)
    gather = link.all_gather(weights, dp)
    scatter = link.reduce_scatter(grads, dp)
    if c.zero_stage == 1:
        return exposed(scatter, behind_backward) + exposed(gather, behind_forward)
    if c.zero_stage == 2:
        return c.grad_accum * exposed(scatter, behind_backward) + exposed(gather, behind_forward)
    return c.grad_accum * (
        exposed(scatter + gather, behind_backward) + exposed(gather, behind_forward)
    )


def _optimizer_time(work: Workload, c: Candidate, cl: Cluster, params: float) -> float:
    """AdamW reads parameter, gradient and two moments and writes three (28 bytes per fp32
    parameter) on this rank's shard, at device memory speed; offloaded, the same step runs on
    the host at its memory bandwidth (host_step_gbps), after the shard's fp32 gradients go
    down and before its 16-bit parameters come back over the host link, and offloaded ZeRO-3
    parameters also come up for every forward and backward."""
    shard = params / (c.replicas if c.zero_stage >= 1 else 1)
    mixed = work.itemsize if work.precision != "fp32" else 0
    if c.cpu_offload == "none":
        return shard * (28 + mixed) / cl.memory_bandwidth
    host_step = cl.host_step_bandwidth or cl.host_bandwidth
    time = shard * 28 / host_step + shard * (4 + work.itemsize) / cl.host_bandwidth
    if c.cpu_offload == "optimizer+params":
        time += c.grad_accum * 2 * shard * work.itemsize / cl.host_bandwidth
    return time


def model_flops(work: Workload) -> float:
    """The step's FLOPs as the loop's MFU counts them (models/costs.py, no recomputation)."""
    task = "pretraining" if work.nsp else "causal_lm"
    return step_flops(
        work.model,
        samples=work.global_batch,
        seq=work.seq,
        head_tokens=work.global_batch * work.seq * work.head_fraction,
        task=task,
    )


def pipeline_makespan(stage_time: list[float], micro_batches: int, chunks: int) -> float:
    """m x the slowest stage, plus the fill and drain through the others (1/v of it with v
    interleaved chunks): `simulate.simulate`'s makespan (m + (p - 1) / v) T for equal stages."""
    slowest = max(stage_time)
    return micro_batches * slowest + (sum(stage_time) - slowest) / chunks


def _stage_hop(work: Workload, c: Candidate, cl: Cluster) -> float:
    """One activation (or its gradient) across a stage boundary, over the link it crosses (a
    boundary crosses nodes once a stage fills one). Under sequence parallelism each TP rank
    sends its 1/t of the sequence; otherwise each sends the whole (replicated) activation, or,
    with `work.stack.scatter_gather_hops` (Megatron-LM's), 1/t of it, which the next stage
    all-gathers over its TP link."""
    nbytes = work.seq / c.cp * c.micro_batch * work.model.hidden_size * work.itemsize
    link = cl.link(c.replicas * c.tp + 1)
    if c.sequence_parallel:
        return link.send(nbytes / c.tp)
    if work.stack.scatter_gather_hops and c.tp > 1:
        return link.send(nbytes / c.tp) + cl.link(c.tp).all_gather(nbytes, c.tp)
    return link.send(nbytes)


def predict_time(work: Workload, c: Candidate, cl: Cluster) -> TimePrediction:
    split = c.split(work)
    per_layer = layer_time(work, c, cl)
    share = local_core_share(work, c, cl)
    per_local = layer_time(work, c, cl, share) if share < 1 else per_layer
    locals_ = local_layers(work, split) if share < 1 else [0] * len(split)
    tp_layer = tensor_comm_time(work, c, cl) + context_comm_time(work, c, cl)
    embedding, head = _ends_time(work, c, cl)
    params = [s.total for s in stage_params(work, c)]
    hop = _stage_hop(work, c, cl) if c.pp > 1 else 0.0
    stage_time, compute, comm = [], [], []
    for r in range(c.pp):
        layers, local = sum(split[r :: c.pp]), sum(locals_[r :: c.pp])
        work_r = (
            (layers - local) * per_layer
            + local * per_local
            + (embedding if r == 0 else 0)
            + (head if r == c.pp - 1 else 0)
        )
        comm_r = layers * tp_layer + 2 * c.chunks * hop * (c.pp > 1)
        compute.append(work_r)
        comm.append(comm_r)
        stage_time.append(work_r + comm_r)
    slowest = max(range(c.pp), key=lambda r: stage_time[r])
    m = c.grad_accum
    pipeline = pipeline_makespan(stage_time, m, c.chunks)
    steady = m * stage_time[slowest]
    backward = compute[slowest] * 2 / 3
    data = _data_comm(work, c, cl, params[slowest], backward)
    optimizer = _optimizer_time(work, c, cl, params[slowest])
    return TimePrediction(
        step=pipeline + data + optimizer,
        compute=m * compute[slowest],
        tensor_comm=m * comm[slowest],
        bubble=pipeline - steady,
        data_comm=data,
        optimizer=optimizer,
        model_flops=model_flops(work),
    )
