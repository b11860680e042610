"""Memory per rank of a layout: model state by the ZeRO paper's formula on this rank's
parameters, activations by Korthikanti et al.'s per-layer terms for what the stage's schedule
holds when a backward is called, plus working buffers and the framework's overhead; held to
what the engine allocates by dry runs (tests/train/test_dry_run.py)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tpformer.engine.memory import zero_memory_bytes
from tpformer.layers.attention_core import flash_runs_the_window
from tpformer.layers.embedding import padded_vocab_size
from tpformer.layers.sequence import labeled_width
from tpformer.models.costs import (
    embedding_params,
    first_layer_saving,
    head_params,
    layer_params,
    word_embedding_params,
)
from tpformer.parallel.random import resolve_rng_mode
from tpformer.planner.candidate import Candidate, Workload
from tpformer.planner.cluster import Cluster
from tpformer.planner.layer_memory import LayerShape, fp8_linear_change, layer_activation_bytes
from tpformer.planner.stage_events import stage_events


def rng_mode(work: Workload, cluster: Cluster) -> str:
    """The parallel.rng mode the run resolves to on the cluster's devices (exact or fast)."""
    return resolve_rng_mode(work.rng, torch.device(cluster.device_type))


def fused_attention(work: Workload, cluster: Cluster) -> bool:
    """Whether the attention core is one fused SDPA kernel that keeps no [b, h, s, s] tensor:
    on an accelerator, unless exact-mode attention dropout makes the core explicit (or the
    workload prices an explicit core: StackProfile.explicit_attention)."""
    return (
        cluster.device_type != "cpu"
        and not work.stack.explicit_attention
        and not exact_attention_dropout(work, cluster)
    )


def exact_attention_dropout(work: Workload, cluster: Cluster) -> bool:
    """Whether attention dropout is drawn in exact mode (layout-independent streams)."""
    return work.model.attention_dropout > 0 and rng_mode(work, cluster) == "exact"


@dataclass(frozen=True)
class StageParams:
    """Parameters per rank of one pipeline stage, by part."""

    embedding: int
    layers: int
    head: int

    @property
    def total(self) -> int:
        return self.embedding + self.layers + self.head


def stage_params(work: Workload, c: Candidate, only: list[int] | None = None) -> list[StageParams]:
    """Per rank, each stage (or those `only` names): the word embedding (vocab-parallel) on the
    first (and, tied, on the last when pipelined), position/segment embeddings, the layers of
    its split, the head."""
    m = work.model
    classifying = work.task == "classification"
    tied = m.tie_embeddings and not classifying  # a classifier has no vocabulary head
    word = word_embedding_params(m, c.tp) if tied else 0
    embedding = embedding_params(m, c.tp)
    head = head_params(m, c.tp, nsp=work.nsp, task=work.task, num_labels=work.num_labels)
    split = c.split(work)
    per_layer = layer_params(work.model, c.tp)
    stages = []
    for r in range(c.pp) if only is None else only:
        first, last = r == 0, r == c.pp - 1
        layers = sum(split[r :: c.pp]) * per_layer - (first_layer_saving(m) if first else 0)
        stages.append(
            StageParams(
                embedding if first else 0,
                layers,
                (head + (word if not first else 0)) if last else 0,
            )
        )
    return stages


def held_at_backward(
    work: Workload,
    c: Candidate,
    stage: int,
    layer: float,
    embedding: float,
    head: float,
    boundary: float,
    stash: float = 0.0,
    local: float = 0.0,
    *,
    outputs_freed: bool = False,
) -> float:
    """The most stage `stage` holds when one of its backwards is called, walking its schedule's
    actions (parallel/pipeline/schedule.py): per chunk of a micro-batch in flight, its layers'
    activations (`local` more for each local-attention layer), on virtual stage 0 the
    embedding's, on the last the head's, elsewhere the output kept for its backward (none
    with `outputs_freed`: on an accelerator a sent output is freed, runner.release_output);
    plus the gradient received for the backward under way and, under PipeDream, its stashed
    weight versions (`stash` bytes each)."""
    split = c.split(work)  # layers per virtual stage
    locals_ = local_layers(work, split)
    last = c.pp * c.chunks - 1
    if c.pp == 1:
        return split[0] * layer + locals_[0] * local + embedding + head

    output = 0.0 if outputs_freed else boundary

    def ends(vs: int) -> float:
        return (embedding if vs == 0 else 0) + (head if vs == last else output)

    # what a micro-batch in flight keeps on each virtual stage
    kept = [split[vs] * layer + locals_[vs] * local + ends(vs) for vs in range(last + 1)]
    held = peak = 0.0
    for forward, vs, versions in stage_events(work, c, stage):
        if forward:
            held += kept[vs]
        else:
            peak = max(peak, held + (boundary if vs < last else 0) + versions * stash)
            held -= kept[vs]
    return peak


def local_layers(work: Workload, split: list[int]) -> list[int]:
    """Local-attention layers per virtual stage (split: its layers, in forward order)."""
    counts, start = [], 0
    for n in split:
        counts.append(sum(work.model.is_local(i) for i in range(start, start + n)))
        start += n
    return counts


def local_attention_bytes(work: Workload, c: Candidate, fused: bool) -> float:
    """What a local (sliding-window) layer keeps beyond a global one: its [b, 1, s, s] mask of
    the whole sequence (the padding and the band; [s, s] for unpadded batches), as the
    additive bias a fused kernel saves (itemsize bytes), or as the bool mask the explicit
    core's masked_fill keeps. Nothing under selective or full recomputation: the core builds
    the band inside what is recomputed (layers/attention_core.py; measured on the dry run:
    the s x s bool mask, 4,096 B at seq 64, gone from the held activations). Each local layer
    makes its own. Nothing under context parallelism (the ring's band is built per block and
    recomputed in backward: layers/ring_attention.py). Nothing where flash runs the window
    itself (layers/attention_core.flash_runs_the_window: the fused core on an accelerator,
    16-bit, unpadded, no attention dropout, an encoder)."""
    if work.model.local_attention is None or c.recompute in ("selective", "full") or c.cp > 1:
        return 0.0
    if flash_windows(work, fused):
        return 0.0
    area = (c.micro_batch if work.padded else 1) * work.seq * work.seq
    return float(area * (work.itemsize if fused else 1))


def flash_windows(work: Workload, fused: bool) -> bool:
    """Whether a local layer's window is flash's own in this workload (`fused`: an
    accelerator's SDPA core; layers/attention_core.flash_runs_the_window)."""
    return fused and flash_runs_the_window(
        accelerator=True,
        sixteen_bit=work.itemsize == 2,
        masked=work.padded,
        dropout_p=work.model.attention_dropout,
        causal=work.model.arch == "gpt",
    )


@dataclass(frozen=True)
class MemoryPrediction:
    """Bytes per rank on the most loaded stage; `host` is what CPU offload keeps off-device."""

    params: float
    grads: float
    optimizer: float
    activations: float
    buffers: float
    overhead: float
    host: float
    stage: int

    @property
    def model_state(self) -> float:
        return self.params + self.grads + self.optimizer

    @property
    def accounted(self) -> float:
        """What the engine accounts (memory_report, offloaded state included) plus the saved
        activations: the part a test measures."""
        return self.model_state + self.host + self.activations

    @property
    def total(self) -> float:
        return self.model_state + self.activations + self.buffers + self.overhead


def activation_parts(
    work: Workload,
    c: Candidate,
    activation_scale: float = 1.0,
    mask_bytes: int = 1,
    fused: bool = False,
    exact_dropout: bool = False,
) -> tuple[float, float, float]:
    """(one layer, the embedding output, the head) bytes per micro-batch on one rank; with
    context parallelism each rank holds s / cp of every sequence."""
    m, s, b, i = work.model, work.seq, c.micro_batch, work.itemsize
    layer = layer_activation_bytes(
        s,
        b,
        m.hidden_size,
        m.num_heads,
        m.intermediate_size,
        tp=c.tp,
        sequence_parallel=c.sequence_parallel,
        recompute=c.recompute,
        itemsize=i,
        mask_bytes=mask_bytes,
        fused_attention=fused,
        context=c.cp,
        attention_dropout=exact_dropout,
        shape=LayerShape.of(m, c.tp),
        masked=work.padded,
    )
    if work.precision == "fp8" and c.recompute != "full":
        sbh, sbf = s / c.cp * b * m.hidden_size, s / c.cp * b * m.intermediate_size
        own_copy = c.cp > 1 or c.recompute == "selective" or not fused
        layer += fp8_linear_change(sbh, sbf, c.tp, c.sequence_parallel, i, own_copy)
    return (activation_scale * layer, *_end_parts(work, c, mask_bytes))


def _end_parts(work: Workload, c: Candidate, mask_bytes: int) -> tuple[float, float]:
    """(the embedding output's, the head's) bytes per micro-batch on one rank."""
    m, s, b, i = work.model, work.seq, c.micro_batch, work.itemsize
    q = c.tp if c.sequence_parallel else 1
    local = s // c.cp
    sbh = local * b * m.hidden_size
    vocab = padded_vocab_size(m.vocab_size, c.tp, m.pad_vocab_to) // c.tp
    # a pre-norm encoder (ModernBERT): its first layer has no attention norm, so it keeps no
    # norm input (its QKV projection keeps the embedding output itself), and a final norm
    # keeps the encoder's output; BERT's pooler keeps that output by its view of the first token
    prenorm = m.arch == "bert" and m.norm.position == "pre"
    first_norm = sbh * i / q if prenorm and c.recompute != "full" else 0.0
    dropout_mask = mask_bytes if m.dropout > 0 else 0
    if work.task == "classification":  # embedding: as BERT's, and the batch's three int64
        # [b, s] tensors (ids, segments, mask; at full recomputation a layer's share of them is
        # large). head: the encoder's output, kept whole by the pooler's view of its first
        # token, unless SP or CP hand the pooler a copy of that token (or it pools the mean,
        # whose product keeps only the mask); the pooler's and classifier's [b, h] rows are
        # not priced
        batch = 3 * 8 * b * s
        copied = c.sequence_parallel or c.cp > 1 or (prenorm and m.classifier_pooling == "mean")
        head = (0.0 if copied else sbh * i / q) + (sbh * i / q if prenorm else 0.0)
        return sbh * (i + dropout_mask) / q + batch - first_norm, head
    if m.arch == "bert":  # embedding: the norm's input, dropout mask. head: the encoder's
        # output (the pooler's view, or the final norm's input); on every TP and CP rank the
        # gathered labeled rows, the transform's and GELU's outputs, the norm's output, and
        # the logits in their own dtype (the loss recomputes its softmax: layers/loss.py)
        embedding = sbh * (i + dropout_mask) / q - first_norm
        rows = b * labeled_width(s, work.head_fraction)
        final = sbh * i / q if prenorm else 0.0  # the final norm's output, kept by the gather
        head = sbh * i / q + final + rows * (4 * m.hidden_size + vocab) * i
    else:  # embedding: dropout mask. head: the final norm's input and output (the
        # vocabulary projection's input, kept as the sequence chunk under SP), the logits
        embedding = sbh * mask_bytes / q if m.dropout > 0 else 0.0
        # every position this rank holds (the last one's target is ignored, not cut off)
        head = 2 * sbh * i / q + local * b * vocab * i
    return embedding, head


def working_params(
    work: Workload, c: Candidate, params: StageParams, layers: int
) -> tuple[float, float]:
    """(gradient elements ZeRO-2/3 hold whole at once, parameter elements ZeRO-3 holds
    gathered) on one stage. tpformer's engine, one bucket per block: the root's (embeddings and
    head, reduced last and gathered for the whole step) and two layers' (one reducing while the
    next fills). With buckets of `work.bucket_elements` (parallel.bucket_mb):
    gradients in three buckets at once (one reducing, two filling: buckets are cut in forward
    order, and backward starts one before it completes the other, e.g. a weight's bucket before
    its bias's), each at most the cap or one parameter larger than it (a layer's largest matrix,
    or for one of the three the word embedding); an engine that also gathers per bucket
    (`work.stack.gather_per_bucket`, DeepSpeed's ZeRO-3) holds two buckets of gradients and of
    parameters, none smaller than a layer's largest matrix. (A pre-norm encoder's smaller
    first layer takes the front of a full layer's pooled buffer: engine/flat_buffer.py.)"""
    per_layer = layer_params(work.model, c.tp) if layers else 0  # the largest layer's
    smaller = first_layer_saving(work.model) if params.embedding and layers <= 2 else 0
    blocks = params.embedding + params.head + 2 * per_layer - smaller
    if not work.bucket_elements:
        return blocks, blocks
    h, f = work.model.hidden_size, work.model.intermediate_size
    largest = max(h * f, 3 * h * h) / c.tp
    if work.stack.gather_per_bucket:
        bucket = 2 * min(per_layer, max(work.bucket_elements, largest))
        return bucket, bucket
    bucket = max(work.bucket_elements, largest)
    first = bucket
    if params.embedding or params.head:
        vocab = padded_vocab_size(work.model.vocab_size, c.tp, work.model.pad_vocab_to) // c.tp
        first = max(bucket, vocab * h)
    return min(params.total, first + 2 * bucket), blocks


def predict_stage_memory(
    work: Workload, c: Candidate, cluster: Cluster, only: list[int] | None = None
) -> list[MemoryPrediction]:
    """Memory per rank of each pipeline stage (or of the stages `only` names, in order)."""
    fused = fused_attention(work, cluster)
    # an accelerator frees sent stage outputs (runner.release_output; not PipeDream's runner)
    freed = cluster.device_type != "cpu" and c.schedule != "pipedream"
    layer, embedding, head = activation_parts(
        work,
        c,
        cluster.activation_scale,
        cluster.mask_bytes,
        fused,
        exact_attention_dropout(work, cluster),
    )
    local = cluster.activation_scale * local_attention_bytes(work, c, fused)
    q = c.tp if c.sequence_parallel else 1
    boundary = work.seq // c.cp * c.micro_batch * work.model.hidden_size * work.itemsize / q
    split = c.split(work)
    mixed = work.precision != "fp32"
    stages = []
    numbers = list(range(c.pp)) if only is None else only
    for r, params in zip(numbers, stage_params(work, c, numbers), strict=True):
        state = zero_memory_bytes(
            c.zero_stage,
            params.total,
            c.replicas,
            param_bytes=work.itemsize,
            mixed=mixed,
            grad_bytes=work.stack.grad_bytes,
        )
        stash = work.itemsize * params.total  # a PipeDream weight version: the stage's weights
        parts = (layer, embedding, head, boundary, stash, local)
        acts = held_at_backward(work, c, r, *parts, outputs_freed=freed)
        layers = sum(split[r :: c.pp])
        host = 0.0
        optimizer, params_bytes = float(state.optimizer), float(state.params)
        if c.cpu_offload != "none":
            host, optimizer = host + optimizer, 0.0
        if c.cpu_offload == "optimizer+params":
            host, params_bytes = host + params_bytes, 0.0
        whole_grads, gathered = working_params(work, c, params, layers)
        if c.grad_accum > 1 and not work.stack.gather_per_bucket:
            # tpformer's ZeRO-2/3: a later micro-batch's reduce-scatter lands in a pooled
            # shard-size buffer per bucket in flight, then is added to the shard
            whole_grads += whole_grads / c.replicas
        buffers = (work.stack.grad_bytes * whole_grads if c.zero_stage >= 2 else 0) + (
            work.itemsize * gathered if c.zero_stage == 3 else 0
        )
        grads = float(state.grads)
        stages.append(
            MemoryPrediction(
                params_bytes, grads, optimizer, acts, buffers, cluster.overhead, host, r
            )
        )
    return stages


def candidate_peak_stages(work: Workload, c: Candidate) -> list[int]:
    """The stages that can need the most: the first, the last, and of the middle stages the
    first of each layer count. Middle stages with as many layers hold the same parameters and
    differ only in the micro-batches in flight, which no schedule lets grow with the stage
    index, so the first of them needs the most (and is the one a full scan would return)."""
    split = c.split(work)
    stages, counts = [0], set()
    for r in range(1, c.pp - 1):
        layers = sum(split[r :: c.pp])
        if layers not in counts:
            counts.add(layers)
            stages.append(r)
    return [*stages, c.pp - 1] if c.pp > 1 else stages


def predict_memory(work: Workload, c: Candidate, cluster: Cluster) -> MemoryPrediction:
    """Memory per rank of the stage that needs the most."""
    only = candidate_peak_stages(work, c)
    return max(predict_stage_memory(work, c, cluster, only), key=lambda m: m.total)
