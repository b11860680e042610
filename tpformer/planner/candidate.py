"""What the planner chooses between: a workload (the model and the batch, fixed by the user)
and candidate layouts (how the work is split and what is traded for memory), each one the
Hydra overrides of a run that computes the same losses as every other."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from functools import lru_cache

from tpformer.config.derive import finetune_micro_batching, mlm_fraction
from tpformer.config.schema import (
    Config,
    CpuOffload,
    FinetuneConfig,
    ModelConfig,
    PipelineSchedule,
    PipelineSplit,
    Recompute,
    ZeroStage,
)
from tpformer.engine.units import bucket_elements
from tpformer.parallel.layout import divisors
from tpformer.planner.partition import best_split, equal_split
from tpformer.planner.split import head_per_layer, layer_unit_costs


@dataclass(frozen=True)
class StackProfile:
    """Where another framework's published run (Megatron-LM and DeepSpeed, 2021-22) ran
    differently from tpformer's engine; the defaults are tpformer. Only the published-run
    checks (tools/published_runs.py) set them."""

    explicit_attention: bool = False
    """Price an explicit attention core (scores materialized, softmax and dropout on them) even
    where tpformer would run the fused kernel: how Megatron-LM ran before FlashAttention (2021,
    2022), with its per-rank dropout streams under rng=fast."""
    scatter_gather_hops: bool = False
    """Price Megatron-LM's scatter/gather stage hops (Narayanan et al. 2021, 4.1): without
    sequence parallelism each TP rank sends 1/t of the activation to the next stage, which
    all-gathers it; tpformer's pipeline sends the whole activation from every TP rank."""
    grad_bytes: int = 4
    """Bytes per gradient element the engine keeps: 4, tpformer's fp32 buffers (also under
    grad_compression=bf16, which only sends 16-bit); 2 prices an engine that keeps 16-bit
    gradients (the ZeRO paper's 16 bytes per parameter, DeepSpeed, 2021 Megatron-LM)."""
    gather_per_bucket: bool = False
    """ZeRO-3 gathers parameters bucket by bucket too (DeepSpeed); tpformer gathers blocks."""


TPFORMER = StackProfile()


@dataclass(frozen=True)
class Workload:
    """What stays fixed while the layout changes: model, sequence, global batch and the two
    numeric choices that change losses (precision, gradient compression)."""

    model: ModelConfig
    seq: int
    global_batch: int
    precision: str
    head_fraction: float
    """Share of a sample's tokens that go through the vocabulary head (MLM: mask_prob)."""
    grad_compression: str = "none"
    nsp: bool = True
    """BERT's pooler and next-sentence head are part of the model (not ModernBERT's)."""
    name: str = ""
    """The model's preset name, for messages."""
    rng: str = "auto"
    """parallel.rng: exact-mode attention dropout keeps the [b, h, s, s] tensors and draws
    per-sample streams; fast (auto on accelerators) runs the fused attention kernel."""
    bucket_elements: int = 0
    """0: gradients and ZeRO-3's gathered parameters are whole blocks, as tpformer's engine
    buckets them by default; > 0: gradient buckets of at most this many elements
    (parallel.bucket_mb; DeepSpeed's reduce_bucket_size is 5e8)."""
    stack: StackProfile = field(default_factory=lambda: TPFORMER)
    """How the priced stack differs from tpformer's engine: tpformer itself unless a published
    run of another stack is priced (tools/published_runs.py)."""
    pipedream_every_step: bool = False
    """parallel.pipedream_update=step: a PipeDream stage updates once per step (else after each
    micro-batch), which sets how many weight versions it stashes."""
    pipedream_vertical_sync: bool = False
    """parallel.pipedream_vertical_sync: every stage reads the first stage's version."""
    task: str = "pretraining"
    """models/costs.TASKS: pretraining, causal_lm, or classification (fine-tuning: the pooler
    and a classifier of `num_labels` outputs are the whole head)."""
    num_labels: int = 2
    padded: bool = True
    """Batches carry a padding mask (BERT's real corpora, GLUE; not synthetic data, not GPT's
    filled sequences), so a local-attention layer's mask is [b, 1, s, s] rather than the band
    [s, s] alone, and grouped key/value heads are expanded for the masked kernel."""

    @classmethod
    def finetuning(cls, config: FinetuneConfig, model: ModelConfig, num_labels: int) -> Workload:
        """A fine-tuning job priced at its widest batch (data.max_length tokens per example)."""
        return cls(
            model,
            config.data.max_length,
            config.trainer.batch_size,
            str(config.parallel.precision),
            0.0,
            str(config.parallel.grad_compression),
            nsp=False,
            name=str(model.arch),
            rng=str(config.parallel.rng),
            bucket_elements=bucket_elements(config.parallel.bucket_mb),
            task="classification",
            num_labels=num_labels,
        )

    @classmethod
    def of(cls, config: Config, global_batch: int, name: str = "") -> Workload:
        bert = config.model.arch == "bert"
        return cls(
            config.model,
            config.data.seq_length,
            global_batch,
            str(config.parallel.precision),
            mlm_fraction(config.data) if bert else 1.0,
            str(config.parallel.grad_compression),
            nsp=bert and config.model.pooler == "tanh",
            name=name or str(config.model.arch),
            rng=str(config.parallel.rng),
            bucket_elements=bucket_elements(config.parallel.bucket_mb),
            pipedream_every_step=config.parallel.pipedream_update == "step",
            pipedream_vertical_sync=config.parallel.pipedream_vertical_sync,
            task="pretraining" if bert else "causal_lm",
            padded=bert and config.data.source != "synthetic",
        )

    @property
    def itemsize(self) -> int:
        return 4 if self.precision == "fp32" else 2


@dataclass(frozen=True)
class Candidate:
    """One layout: tp x pp x dp x cp ranks, the micro-batching of the global batch, and the memory
    savers (ZeRO stage, offload, sequence parallelism, recomputation)."""

    tp: int
    pp: int
    dp: int
    micro_batch: int
    grad_accum: int
    zero_stage: int = 0
    cpu_offload: str = "none"
    sequence_parallel: bool = False
    recompute: str = "none"
    schedule: str = "1f1b"
    virtual_stages: int = 2
    cp: int = 1
    """Context-parallel degree: each sequence split over cp ranks (ring attention)."""

    @property
    def replicas(self) -> int:
        """Ranks holding the same parameters (DP x CP): gradients are summed over them and ZeRO
        shards over them."""
        return self.dp * self.cp

    @property
    def chunks(self) -> int:
        return self.virtual_stages if self.pp > 1 and self.schedule == "interleaved_1f1b" else 1

    def overrides(self, explicit: bool = False) -> list[str]:
        """The Hydra overrides that run this layout (world size = tp x pp x dp x cp); `explicit`:
        also the keys left at their defaults."""
        out = [
            f"parallel.tensor={self.tp}",
            f"parallel.pipeline={self.pp}",
            f"parallel.zero_stage={self.zero_stage}",
        ]
        if self.cp > 1 or explicit:
            out.append(f"parallel.context={self.cp}")
        if self.cpu_offload != "none" or explicit:
            out.append(f"parallel.cpu_offload={self.cpu_offload}")
        if self.sequence_parallel or explicit:
            out.append(f"parallel.sequence_parallel={str(self.sequence_parallel).lower()}")
        if self.recompute != "none" or explicit:
            out.append(f"parallel.recompute={self.recompute}")
        if self.pp > 1 or explicit:
            out.append(f"parallel.pipeline_schedule={self.schedule}")
        return [
            *out,
            f"trainer.micro_batch_size={self.micro_batch}",
            f"trainer.grad_accum={self.grad_accum}",
        ]

    def label(self) -> str:
        parts = [
            f"tp{self.tp}",
            f"pp{self.pp}",
            f"dp{self.dp}",
            *([f"cp{self.cp}"] if self.cp > 1 else []),
            f"z{self.zero_stage}",
            f"mb{self.micro_batch}",
        ]
        if self.pp > 1:
            parts.append({"1f1b": "1f1b", "gpipe": "gpipe"}.get(self.schedule, "int"))
        if self.sequence_parallel:
            parts.append("sp")
        if self.recompute != "none":
            parts.append(self.recompute)
        if self.cpu_offload != "none":
            parts.append("off-" + self.cpu_offload.replace("optimizer", "opt").replace("+", ""))
        return " ".join(parts)

    def apply(self, config: Config) -> Config:
        """`config` at this layout (the other keys unchanged)."""
        parallel = replace(
            config.parallel,
            tensor=self.tp,
            pipeline=self.pp,
            data=str(self.dp),
            context=self.cp,
            zero_stage=ZeroStage(self.zero_stage),
            cpu_offload=CpuOffload(self.cpu_offload),
            sequence_parallel=self.sequence_parallel,
            recompute=Recompute(self.recompute),
            recompute_num_layers=0,
            recompute_every=1,
            pipeline_schedule=PipelineSchedule(self.schedule),
            virtual_stages=self.virtual_stages,
            pipeline_split=PipelineSplit.balanced,
            pipeline_layers=[],
        )
        trainer = replace(
            config.trainer, micro_batch_size=self.micro_batch, grad_accum=self.grad_accum
        )
        return replace(config, parallel=parallel, trainer=trainer)

    def split(self, work: Workload) -> list[int]:
        """Layers per virtual stage, as `parallel.pipeline_split=balanced` chooses them."""
        if self.pp == 1:
            return [work.model.num_layers]
        if self.chunks > 1:
            return equal_split(work.model.num_layers, self.pp * self.chunks)
        return list(
            _balanced_split(
                head_per_layer(work.model, work.seq, work.head_fraction),
                work.model.num_layers,
                self.pp,
            )
        )


@lru_cache(maxsize=4096)
def _balanced_split(head: float, layers: int, stages: int) -> tuple[int, ...]:
    return tuple(best_split(layer_unit_costs(head, layers), stages))


def candidate_of(config: Config | FinetuneConfig, dp: int) -> Candidate:
    """The layout `config` runs at with data-parallel degree dp (its degrees resolved: no
    "auto" left); a fine-tuning job's micro-batch defaults to its DP rank's whole batch."""
    p = config.parallel
    if isinstance(config, FinetuneConfig):
        micro, accumulation = finetune_micro_batching(config.trainer, dp)
    else:
        micro, accumulation = config.trainer.micro_batch_size, config.trainer.grad_accum
    return Candidate(
        int(p.tensor),
        int(p.pipeline),
        dp,
        micro,
        accumulation,
        int(p.zero_stage),
        str(p.cpu_offload),
        p.sequence_parallel,
        str(p.recompute),
        str(p.pipeline_schedule),
        p.virtual_stages,
        p.context,
    )


def tensor_degrees(model: ModelConfig, gpus_per_node: int) -> list[int]:
    """TP degrees that divide the heads and FFN width and stay inside one node."""
    return [
        t
        for t in divisors(gpus_per_node)
        if model.num_heads % t == 0 and model.intermediate_size % t == 0
    ]


def enumerate_candidates(
    work: Workload,
    world: int,
    gpus_per_node: int,
    *,
    max_micro_batch: int = 64,
    device_type: str = "cuda",
) -> Iterator[Candidate]:
    """Every layout tpformer accepts for `work` on `world` devices (the validator's rules:
    ZeRO-2/3 not with pipelines, interleaving needs p | m and pv | layers, offload of
    parameters needs ZeRO-3, sequence parallelism needs tp > 1 dividing the sequence, context
    parallelism needs 2 cp dividing the sequence). Context parallelism is
    enumerated for sequences of CONTEXT_MIN_SEQ tokens or more, inside a node after TP."""
    layers = work.model.num_layers
    for tp in tensor_degrees(work.model, gpus_per_node):
        if world % tp:
            continue
        for cp in context_degrees(work.seq, tp, gpus_per_node, world):
            yield from _candidates(work, world, tp, cp, layers, max_micro_batch, device_type)


CONTEXT_MIN_SEQ = 4096
"""Shorter sequences are not split over CP ranks by the search: their attention is a small
share of the step, and the ring's latency would not hide behind it."""


def context_degrees(seq: int, tp: int, gpus_per_node: int, world: int) -> list[int]:
    """CP degrees the search tries with TP degree tp: 1, and for long sequences those that
    keep tp x cp inside a node and split the sequence into 2 cp chunks."""
    if seq < CONTEXT_MIN_SEQ:
        return [1]
    return [
        cp
        for cp in divisors(max(1, gpus_per_node // tp))
        if world % (tp * cp) == 0 and seq % (2 * cp) == 0
    ]


def _candidates(
    work: Workload,
    world: int,
    tp: int,
    cp: int,
    layers: int,
    max_micro_batch: int,
    device_type: str,
) -> Iterator[Candidate]:
    """enumerate_candidates at one (tp, cp)."""
    for pp in divisors(world // (tp * cp)):
        if pp > layers:
            continue
        dp = world // (tp * pp * cp)
        if work.global_batch % dp:
            continue
        per_rank = work.global_batch // dp
        for micro in divisors(per_rank):
            if micro > max_micro_batch:
                continue
            m = per_rank // micro
            schedules = ["1f1b"] if pp == 1 else ["1f1b", "gpipe"]
            if pp > 1 and m % pp == 0 and layers % (2 * pp) == 0:
                schedules.append("interleaved_1f1b")
            for schedule in schedules:
                for stage in (0,) if dp * cp == 1 else (0, 1) if pp > 1 else (0, 1, 2, 3):
                    offloads = ["none", "optimizer"] + (["optimizer+params"] if stage == 3 else [])
                    if device_type == "cpu":
                        offloads = ["none"]  # host memory is device memory
                    for offload in offloads:
                        split = tp * cp  # SP splits each CP rank's part over TP
                        can_sp = tp > 1 and work.seq % split == 0
                        for sp in (False, True) if can_sp else (False,):
                            for recompute in ("none", "selective", "full"):
                                yield Candidate(
                                    tp,
                                    pp,
                                    dp,
                                    micro,
                                    m,
                                    stage,
                                    offload,
                                    sp,
                                    recompute,
                                    schedule,
                                    cp=cp,
                                )
