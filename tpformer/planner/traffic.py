"""What one rank does per step, priced from the layout alone as tpformer's engine does it: the
bytes it sends in each process group (`step_traffic`) and the FLOPs it executes (`rank_flops`),
which a dry run (train/dry_run.py) counts call by call and op by op.

Keys are "<op> <group>" with the group by its role (tp, dp, dp_cp, cp, pp, pp_gradients,
pipeline_ends); bytes are what comm/record.py counts, the ring model's share of each call
(`sent_bytes`). Left out: the scalars a step reduces besides its tensors (sample and token
counts, loss totals, the gradient norm: a few bytes per call).
"""

from __future__ import annotations

from collections.abc import Callable

from tpformer.layers.embedding import padded_vocab_size
from tpformer.layers.grouped_qkv import replicates_kv
from tpformer.layers.sequence import labeled_width
from tpformer.models.costs import kv_elements, norm_params, rank_executed_flops
from tpformer.parallel.comm.record import sent_bytes
from tpformer.planner.candidate import Candidate, Workload
from tpformer.planner.memory import stage_params
from tpformer.planner.step_time import ring_block_elements, ring_bytes_per_layer

Add = Callable[..., None]
"""add(op, group, size, full bytes, calls=1): count calls of a collective."""


def step_traffic(work: Workload, c: Candidate, stage: int) -> dict[str, float]:
    """{"op group": bytes} one rank of pipeline stage `stage` sends per step."""
    m, b, h, i = c.grad_accum, c.micro_batch, work.model.hidden_size, work.itemsize
    local = work.seq // c.cp
    act = local * b * h * i  # one micro-batch's hidden states, the whole (local) sequence
    split = c.split(work)
    layers = sum(split[stage :: c.pp])
    first, last = stage == 0, stage == c.pp - 1
    recomputed = layers if c.recompute == "full" else 0
    out: dict[str, float] = {}

    def count(key: str, sent: float) -> None:
        out[key] = out.get(key, 0.0) + sent

    def add(op: str, group: str, size: int, full: float, calls: float = 1) -> None:
        """`calls` calls of `op` over `full` bytes in the group of that role and size."""
        if size > 1:
            count(f"{op} {group}", calls * sent_bytes(op, full, size))

    if c.tp > 1:
        _tensor_parallel(work, c, add, act, layers, recomputed, first=first, last=last)
    model = work.model
    classifying = work.task == "classification"
    if last and model.arch == "bert" and (classifying or model.pooler == "tanh"):
        if classifying and model.pooler == "head" and model.classifier_pooling == "mean":
            # the mean's row sums over the sequence's ranks (CP: its gradient too)
            if c.sequence_parallel and c.tp > 1:
                add("all_reduce", "tp", c.tp, b * h * i, m)
            if c.cp > 1:
                add("all_reduce", "cp", c.cp, b * h * i, 2 * m)
        else:  # the pooler's first token, from the rank holding it
            if c.sequence_parallel and c.tp > 1:
                add("broadcast", "tp", c.tp, b * h * i, m)
            if c.cp > 1:
                add("broadcast", "cp", c.cp, b * h * i, m)
    if c.cp > 1:  # ring attention: keys and values around the ring, their gradients back
        heads = work.model.num_heads
        ring = ring_bytes_per_layer(b, heads, work.seq, h, tp=c.tp, cp=c.cp, itemsize=i)
        block = ring_block_elements(b, heads, work.seq, h, tp=c.tp, cp=c.cp)
        count("send cp", m * (layers * ring + recomputed * (c.cp - 1) * block * i))
    if c.pp > 1:
        chunk = act / (c.tp if c.sequence_parallel else 1)
        sent = m * (c.chunks - (1 if last else 0))
        received = m * (c.chunks - (1 if first else 0))
        count("send pp", sent * chunk)
        count("send pp_gradients", received * chunk)
        tied = (
            c.schedule != "pipedream"
            and work.task != "classification"
            and work.model.tie_embeddings
        )
        if (first or last) and tied:  # the tied word embedding's gradient, summed over both
            # ends (PipeDream's ends train their own copies; a classifier ties nothing)
            vocab = padded_vocab_size(work.model.vocab_size, c.tp, work.model.pad_vocab_to)
            add("all_reduce", "pipeline_ends", 2, 4 * vocab // c.tp * h)
    _data_parallel(work, c, stage, add)
    return {key: sent for key, sent in out.items() if sent}


def _tensor_parallel(
    work: Workload,
    c: Candidate,
    add: Add,
    act: float,
    layers: int,
    recomputed: int,
    *,
    first: bool,
    last: bool,
) -> None:
    """Per micro-batch: without SP two all-reduces forward and two backward per layer (and the
    recomputed forward's), the vocabulary-parallel embedding's forward, the head's input
    gradient and the loss's three row reductions; with SP each all-reduce becomes a
    reduce-scatter and all-gathers (the column-parallel inputs gathered forward and again
    backward), and the sequence-parallel parameters' gradients are summed once per step."""
    m, t, h, gpt = c.grad_accum, c.tp, work.model.hidden_size, work.model.arch == "gpt"
    # the loss's rows: every predicting position (under CP this rank's), BERT's labeled ones;
    # the head's input: GPT's hidden states, BERT's gathered labeled rows
    predicting = work.seq // c.cp  # the last position's target is ignored, not cut off
    rows = c.micro_batch * (predicting if gpt else labeled_width(work.seq, work.head_fraction))
    head = act if gpt else rows * h * work.itemsize
    # a classifier (fine-tuning) is whole on every TP rank: no vocabulary head, no row sums
    vocabulary = last and work.task != "classification"
    if vocabulary:
        add("all_reduce", "tp", t, 4 * rows, 3 * m)
    model = work.model
    # a replicated key/value projection's gradient, summed over TP once per step
    kv = 2 * model.kv_heads * (h // model.num_heads)
    whole_kv = (kv_elements(model) + (kv if model.bias or model.qkv_bias else 0)) * layers
    whole_kv = whole_kv if replicates_kv(model.kv_heads, t) else 0
    if not c.sequence_parallel:
        calls = 4 * layers + 2 * recomputed + (1 if first else 0)
        add("all_reduce", "tp", t, act, m * calls)
        if vocabulary:
            add("all_reduce", "tp", t, head, m)
        if whole_kv:
            add("all_reduce", "tp", t, 4 * whole_kv)
        return
    # GPT's head gathers its input as a column-parallel layer does; BERT's sums its labeled
    # rows over the group (each held by one rank) and all-reduces their gradient
    gathers = 6 * layers + 2 * recomputed + (1 if first else 0) + (2 if last and gpt else 0)
    scatters = 4 * layers + 2 * recomputed + (1 if first else 0) + (1 if last and gpt else 0)
    fp8_gathers = 4 * layers + 2 * recomputed if work.precision == "fp8" else 0  # as fp8
    add("all_gather", "tp", t, act, m * (gathers - fp8_gathers))
    add("all_gather", "tp", t, act / work.itemsize, m * fp8_gathers)
    add("reduce_scatter", "tp", t, act, m * scatters)
    if vocabulary and not gpt:
        add("all_reduce", "tp", t, head, 2 * m)
    # each layer's two norms and two row-parallel biases
    marked = (2 * norm_params(model) + (2 * h if model.bias else 0)) * layers + whole_kv
    prenorm_encoder = not gpt and model.norm.position == "pre"
    if first:  # the embeddings outside the vocabulary: positions (BERT: segments, the norm;
        # a pre-norm encoder's first layer has no attention norm)
        marked += model.max_position_embeddings * h if model.rotary is None else 0
        marked += 0 if gpt else model.type_vocab_size * h + norm_params(model)
        marked -= norm_params(model) if prenorm_encoder else 0
    if last and (gpt or prenorm_encoder):
        marked += norm_params(model)  # the final norm
    add("all_reduce", "tp", t, 4 * marked)


def _data_parallel(work: Workload, c: Candidate, stage: int, add: Add) -> None:
    """The gradients' fp32 buckets and the parameters by ZeRO stage, over the replicas (DP,
    and CP whose ranks hold the same parameters): stage 0 all-reduces once per step, 1
    reduce-scatters once and all-gathers the updated parameters, 2 reduce-scatters every
    micro-batch, 3 also gathers every block's parameters for every forward and again for its
    backward (the root's stay gathered through the step). A PipeDream stage reduces at each
    of its updates: once per step under pipedream_update=step, else every micro-batch."""
    n, m = c.replicas, c.grad_accum
    updates = m if c.schedule == "pipedream" and not work.pipedream_every_step else 1
    group = "dp_cp" if c.cp > 1 else "dp"
    (params,) = stage_params(work, c, [stage])
    grads = 4 * params.total
    weights = work.itemsize * params.total
    if c.zero_stage == 0:
        add("all_reduce", group, n, grads, updates)
    elif c.zero_stage == 1:
        add("reduce_scatter", group, n, grads, updates)
        add("all_gather", group, n, weights, updates)
    elif c.zero_stage == 2:
        add("reduce_scatter", group, n, grads, m)
        add("all_gather", group, n, weights, updates)
    else:
        add("reduce_scatter", group, n, grads, m)
        blocks = work.itemsize * params.layers
        add("all_gather", group, n, weights + blocks, m)


def priced_keys(counted: str) -> list[str]:
    """The planner's keys for a counted "op group" (comm/record.py): a process group in several
    roles is named by all of them ("all_reduce tp/control")."""
    op, roles = counted.split(" ", 1)
    return [f"{op} {role}" for role in roles.split("/")]


def priced(traffic: dict[str, float], counted: str) -> float:
    """The planner's bytes for a counted "op group"."""
    return sum(traffic.get(key, 0.0) for key in priced_keys(counted))


def rank_flops(work: Workload, c: Candidate, stage: int) -> float:
    """FLOPs one rank of pipeline stage `stage` executes per step (models/costs.py's count of
    its layers, and on the last stage its heads)."""
    m = work.model
    last = stage == c.pp - 1
    samples = c.grad_accum * c.micro_batch
    per_sample = labeled_width(work.seq, work.head_fraction) if m.arch == "bert" else 0
    rows = samples * (per_sample or work.seq / c.cp)  # GPT: every position this rank holds
    if work.task == "classification":
        rows = 0  # the pooler and classifier only
    return rank_executed_flops(
        m,
        samples=samples,
        seq=work.seq,
        layers=sum(c.split(work)[stage :: c.pp]),
        tp=c.tp,
        cp=c.cp,
        recompute=c.recompute,
        head_rows=rows if last else 0.0,
        padded_vocab=padded_vocab_size(m.vocab_size, c.tp, m.pad_vocab_to),
        pooled=last and m.arch == "bert",
        task=work.task,
        num_labels=work.num_labels,
    )
