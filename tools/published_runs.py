"""Published large-scale runs and the options they ran with, to hold the planner against.

Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU Clusters Using
Megatron-LM" (arXiv 2104.04473): Table 1 (GPT models of 1.7B to 1T parameters on 32 to 3,072
A100-80GB GPUs, weak scaling) and Table 2 (175B and 530B models under DeepSpeed ZeRO-3 without
model parallelism, and under PTD-P, at three GPU counts each). Every run: 8 GPUs per DGX A100
node, 16-bit mixed precision, sequence 2048, vocabulary 51,200, full activation recomputation,
TFLOP/s per GPU counted with the paper's formula (which includes the recomputed forward).

The options those runs had, priced as such:
- Megatron-LM 2021 (PTD-P): no ZeRO, no sequence parallelism, full recomputation; the data-
  parallel gradient all-reduce ran after backward, not overlapped with it (cluster
  comm_overlap=0); the attention core materialized its scores, and each rank drew the
  dropout of its own heads (Megatron's model-parallel RNG tracker: rng fast, explicit core).
- DeepSpeed ZeRO-3: one GPU per model replica (no tensor or pipeline parallelism), 16-bit
  gradients in buckets of 5e8 elements (its reduce_bucket_size default), communication
  overlapped (its overlap_comm), full recomputation.

Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models" (arXiv
2205.05198): Table 4 (one layer of a 22B GPT at TP=8, micro-batch 4, forward and backward in
milliseconds, under five recomputation / sequence-parallel options) and Tables 3 and 5 (22B,
175B, 530B and 1T GPTs at TP=8, one model replica each, iteration seconds with full
recomputation and with sequence parallelism + selective recomputation; 175B and 530B on the
interleaved schedule with 3 chunks per stage). Their MFU (41.5, 51.4, 56.0, 56.3%) is in the
Megatron-LM README.

The software of those runs (PyTorch 1.x, CUDA 11, Megatron's own kernels) did not reach the
large-GEMM plateau measured today (`matmul_efficiency` of the a100_node preset, torch 2.6 +
CUDA 12.6), so the published runs are priced with the plateau fitted to one measurement of that
stack: Table 4's baseline layer (megatron_matmul_efficiency). Every other row, Table 4's other
four included, is a prediction.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache

from tpformer.config.schema import (
    Activation,
    Arch,
    MlpConfig,
    ModelConfig,
    NormConfig,
    NormPosition,
)
from tpformer.models.costs import step_flops
from tpformer.planner.candidate import Candidate, StackProfile, Workload, enumerate_candidates
from tpformer.planner.cluster import Cluster, load_preset, resolve_cluster
from tpformer.planner.search import Evaluated, evaluate, tie_ranked
from tpformer.planner.step_time import layer_time, tensor_comm_time

SEQ, VOCAB = 2048, 51200
DEEPSPEED_BUCKET = 500_000_000


@dataclass(frozen=True)
class PublishedRun:
    """One row: the model, its GPUs and batch, the layout run and the TFLOP/s per GPU measured."""

    params_b: float
    heads: int
    hidden: int
    layers: int
    tp: int
    pp: int
    gpus: int
    global_batch: int
    tflops: float
    scheme: str = "ptd-p"
    """ptd-p (Megatron-LM 2021), zero-3 (DeepSpeed ZeRO-3 without model parallelism), full-2022
    (Megatron-LM 2022, full recomputation) or sp-selective (2022: sequence parallelism +
    selective recomputation)."""
    micro_batch: int = 0
    """The micro-batch the paper names (0: not given; the planner's best at that split)."""
    seconds: float = 0.0
    """The iteration time the paper gives (0: it gives TFLOP/s per GPU)."""
    schedule: str = ""
    """The pipeline schedule the paper names ("": the planner's best at that split)."""
    virtual_stages: int = 2
    """Chunks per stage of the interleaved schedule."""

    @property
    def dp(self) -> int:
        return self.gpus // (self.tp * self.pp)


MEGATRON_TABLE_1 = [
    PublishedRun(1.7, 24, 2304, 24, 1, 1, 32, 512, 137),
    PublishedRun(3.6, 32, 3072, 30, 2, 1, 64, 512, 138),
    PublishedRun(7.5, 32, 4096, 36, 4, 1, 128, 512, 142),
    PublishedRun(18.4, 48, 6144, 40, 8, 1, 256, 1024, 135),
    PublishedRun(39.1, 64, 8192, 48, 8, 2, 512, 1536, 138),
    PublishedRun(76.1, 80, 10240, 60, 8, 4, 1024, 1792, 140),
    PublishedRun(145.6, 96, 12288, 80, 8, 8, 1536, 2304, 148),
    PublishedRun(310.1, 128, 16384, 96, 8, 16, 1920, 2160, 155),
    PublishedRun(529.6, 128, 20480, 105, 8, 35, 2520, 2520, 163),
    PublishedRun(1008.0, 160, 25600, 128, 8, 64, 3072, 3072, 163),
]

_GPT175 = (174.6, 96, 12288, 96)
_GPT530 = (529.6, 128, 20480, 105)
MEGATRON_TABLE_2 = [
    PublishedRun(*_GPT175, 1, 1, 384, 1536, 144, "zero-3", 4),
    PublishedRun(*_GPT175, 1, 1, 768, 1536, 88, "zero-3", 2),
    PublishedRun(*_GPT175, 1, 1, 1536, 1536, 44, "zero-3", 1),
    PublishedRun(*_GPT530, 1, 1, 640, 2560, 138, "zero-3", 4),
    PublishedRun(*_GPT530, 1, 1, 1120, 2240, 98, "zero-3", 2),
    PublishedRun(*_GPT530, 1, 1, 2240, 2240, 48, "zero-3", 1),
    PublishedRun(*_GPT175, 8, 12, 384, 1536, 153, "ptd-p", 1),
    PublishedRun(*_GPT175, 8, 12, 768, 1536, 149, "ptd-p", 1),
    PublishedRun(*_GPT175, 8, 12, 1536, 1536, 141, "ptd-p", 1),
    PublishedRun(*_GPT530, 8, 35, 560, 2240, 171, "ptd-p", 1),
    PublishedRun(*_GPT530, 8, 35, 1120, 2240, 167, "ptd-p", 1),
    PublishedRun(*_GPT530, 8, 35, 2240, 2240, 159, "ptd-p", 1),
]


_GPT22 = (22.0, 64, 6144, 48)
_GPT1T = (1008.0, 160, 25600, 128)
_INTERLEAVED = "interleaved_1f1b"
_TABLE_3 = [  # model, TP, PP, GPUs, global batch, micro-batch, schedule, chunks
    (_GPT22, 8, 1, 8, 4, 4, "1f1b", 2),
    (_GPT175, 8, 8, 64, 64, 1, _INTERLEAVED, 3),
    (_GPT530, 8, 35, 280, 280, 1, _INTERLEAVED, 3),
    (_GPT1T, 8, 64, 512, 512, 1, "1f1b", 2),
]
_TABLE_5_SECONDS = {
    "full-2022": (1.42, 18.13, 49.05, 94.42),
    "sp-selective": (1.10, 13.75, 37.83, 71.49),
}
KORTHIKANTI_TABLE_5 = [
    PublishedRun(*model, tp, pp, gpus, batch, 0, scheme, micro, seconds, schedule, chunks)
    for scheme, times in _TABLE_5_SECONDS.items()
    for (model, tp, pp, gpus, batch, micro, schedule, chunks), seconds in zip(_TABLE_3, times)
]
"""Table 5 with the layouts of Table 3: full recomputation, then the paper's own options."""


@dataclass(frozen=True)
class LayerTiming:
    """One row of Korthikanti et al. Table 4: a 22B layer's forward and backward (ms)."""

    name: str
    sequence_parallel: bool
    recompute: str
    forward_ms: float
    backward_ms: float

    @property
    def ms(self) -> float:
        return self.forward_ms + self.backward_ms


KORTHIKANTI_TABLE_4 = [
    LayerTiming("baseline (no recomputation)", False, "none", 7.7, 11.9),
    LayerTiming("sequence parallelism", True, "none", 7.2, 11.8),
    LayerTiming("full recomputation", False, "full", 7.7, 19.5),
    LayerTiming("selective recomputation", False, "selective", 7.7, 13.2),
    LayerTiming("selective + sequence parallelism", True, "selective", 7.2, 13.1),
]
TABLE_4_RUN = KORTHIKANTI_TABLE_5[0]
"""The 22B GPT at TP=8, micro-batch 4, whose layer Table 4 times."""


ZERO_TABLE_1 = {
    7.5e9: {
        1: (120, 120, 120),
        4: (52.5, 41.3, 30),
        16: (35.6, 21.6, 7.5),
        64: (31.4, 16.6, 1.88),
        256: (30.4, 15.4, 0.47),
        1024: (30.1, 15.1, 0.12),
    },
    128e9: {
        1: (2048, 2048, 2048),
        4: (896, 704, 512),
        16: (608, 368, 128),
        64: (536, 284, 32),
        256: (518, 263, 8),
        1024: (513, 257, 2),
    },
    1e12: {
        1: (16000, 16000, 16000),
        4: (7000, 5500, 4000),
        16: (4750, 2875, 1000),
        64: (4187, 2218, 250),
        256: (4046, 2054, 62.5),
        1024: (4011, 2013, 15.6),
    },
}
"""Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward Training Trillion Parameter
Models" (arXiv 1910.02054), Table 1: model-state GB per device under mixed-precision Adam
(16-bit parameters and gradients, fp32 master weights and moments) by parameters, DP degree
and stage (1: optimizer states, 2: + gradients, 3: + parameters partitioned)."""


def gpt(layers: int, hidden: int, heads: int) -> ModelConfig:
    """The paper's GPT: 4h FFN, learned positions up to the sequence, padded vocabulary."""
    return ModelConfig(
        arch=Arch.gpt,
        vocab_size=VOCAB,
        hidden_size=hidden,
        num_layers=layers,
        num_heads=heads,
        intermediate_size=4 * hidden,
        max_position_embeddings=SEQ,
        type_vocab_size=0,
        mlp=MlpConfig(activation=Activation.gelu_tanh),
        norm=NormConfig(position=NormPosition.pre),
        pad_vocab_to=128,
    )


def workload(run: PublishedRun) -> Workload:
    """The run's model and batch under its engine's gradient bytes and buckets."""
    zero3 = run.scheme == "zero-3"
    return Workload(
        gpt(run.layers, run.hidden, run.heads),
        SEQ,
        run.global_batch,
        "bf16",
        1.0,
        nsp=False,
        rng="fast",
        bucket_elements=DEEPSPEED_BUCKET if zero3 else 0,
        stack=StackProfile(
            explicit_attention=True,
            scatter_gather_hops=True,
            grad_bytes=2 if zero3 else 4,
            gather_per_bucket=zero3,
        ),
    )


def _a100(gpus: int, comm_overlap: float | None, matmul_efficiency: float) -> Cluster:
    """a100_node on `gpus` GPUs at a given GEMM plateau (comm_overlap None: the preset's)."""
    config = load_preset("a100_node")
    config = replace(
        config,
        nodes=max(1, gpus // config.gpus_per_node),
        calibration="none",
        comm_overlap=config.comm_overlap if comm_overlap is None else comm_overlap,
        matmul_efficiency=matmul_efficiency,
    )
    return resolve_cluster(config, "bf16", cache_dir="/nonexistent")


def table_4_layer(timing: LayerTiming, cl: Cluster) -> float:
    """Predicted seconds of Table 4's layer under `timing`'s options: forward + backward (+
    recomputation) and its TP collectives, per micro-batch."""
    run = TABLE_4_RUN
    c = Candidate(
        run.tp,
        1,
        1,
        run.micro_batch,
        1,
        sequence_parallel=timing.sequence_parallel,
        recompute=timing.recompute,
    )
    work = workload(run)
    return layer_time(work, c, cl) + tensor_comm_time(work, c, cl)


@lru_cache(maxsize=1)
def megatron_matmul_efficiency() -> float:
    """The large-GEMM plateau (fraction of peak) at which Table 4's baseline layer takes its
    measured 19.6 ms: what Megatron-LM's 2021-22 stack reached (bisection; the layer's time
    falls as the plateau rises)."""
    baseline = KORTHIKANTI_TABLE_4[0]
    low, high = 0.3, 1.0
    for _ in range(40):
        mid = (low + high) / 2
        if table_4_layer(baseline, _a100(8, 0.0, mid)) > baseline.ms / 1e3:
            low = mid
        else:
            high = mid
    return (low + high) / 2


def cluster(run: PublishedRun, *, fitted: bool = True) -> Cluster:
    """a100_node with the run's node count and the 2021-22 stack's GEMM plateau (fitted=False:
    the preset's plateau, measured on today's stack); Megatron-LM did not overlap its DP
    all-reduce with backward (DeepSpeed did)."""
    overlap = None if run.scheme == "zero-3" else 0.0
    plateau = megatron_matmul_efficiency() if fitted else load_preset("a100_node").matmul_efficiency
    return _a100(run.gpus, overlap, plateau)


def allowed(run: PublishedRun, c: Candidate) -> bool:
    """Whether a layout uses only the options the run's framework had."""
    if run.scheme == "sp-selective":
        sp = c.sequence_parallel or c.tp == 1
        return sp and c.recompute == "selective" and c.zero_stage == 0 and c.cpu_offload == "none"
    common = c.recompute == "full" and not c.sequence_parallel and c.cpu_offload == "none"
    if run.scheme == "zero-3":
        return common and c.zero_stage == 3 and c.tp == c.pp == 1
    return common and c.zero_stage == 0


def paper_flops(work: Workload) -> float:
    """Model FLOPs per step as the papers count them (Narayanan et al. 2021, eq. 3:
    96 B s l h^2 (1 + s / 6h + V / 16 l h)): the one count of models/costs.py with every
    layer's forward recomputed; tests/planner/test_published.py holds it to the closed form."""
    m = work.model
    return step_flops(
        m,
        samples=work.global_batch,
        seq=work.seq,
        head_tokens=work.global_batch * work.seq,
        task="causal_lm",
        recomputed_layers=m.num_layers,
    )


def tflops(work: Workload, e: Evaluated, gpus: int) -> float:
    """TFLOP/s per GPU of a predicted step, in the paper's count."""
    assert e.time is not None
    return paper_flops(work) / e.time.step / gpus / 1e12


@dataclass(frozen=True)
class Reproduced:
    """A published run next to the planner: the published layout priced, and the first choice of
    a search restricted to the run's options."""

    run: PublishedRun
    work: Workload
    published: Evaluated
    """The run's tensor x pipeline split (and micro-batch when the paper names it), priced: the
    fastest such layout with the run's options, else (none fits) the one needing least memory."""
    first: Evaluated
    """The planner's first choice among the layouts with the run's options."""

    @property
    def ratio(self) -> float:
        """Predicted / published throughput at the published layout (nan when it does not
        fit): TFLOP/s, or the published over the predicted iteration time."""
        if not self.published.fits:
            return float("nan")
        if self.run.seconds:
            return self.run.seconds / self.published.time.step  # type: ignore[union-attr]
        return tflops(self.work, self.published, self.run.gpus) / self.run.tflops

    @property
    def margin(self) -> float:
        """How much slower the planner predicts the published layout than its first choice."""
        if not self.published.fits:
            return float("inf")
        return self.published.time.step / self.first.time.step - 1  # type: ignore[union-attr]

    @property
    def first_is_published(self) -> bool:
        c = self.first.candidate
        return (c.tp, c.pp) == (self.run.tp, self.run.pp)


def stated_layout(run: PublishedRun) -> Candidate:
    """A layout the paper states whole (micro-batch and schedule), with its scheme's options."""
    present = run.scheme == "sp-selective"
    return Candidate(
        run.tp,
        run.pp,
        run.dp,
        run.micro_batch,
        run.global_batch // run.dp // run.micro_batch,
        zero_stage=3 if run.scheme == "zero-3" else 0,
        sequence_parallel=present and run.tp > 1,
        recompute="selective" if present else "full",
        schedule=run.schedule,
        virtual_stages=run.virtual_stages,
    )


def reproduce(run: PublishedRun, *, max_micro_batch: int = 16, fitted: bool = True) -> Reproduced:
    """Price every layout of the run's workload on its cluster that its framework allowed
    (fitted=False: at today's measured GEMM plateau instead of the one fitted to Table 4)."""
    work, cl = workload(run), cluster(run, fitted=fitted)
    options = [
        evaluate(work, c, cl)
        for c in enumerate_candidates(
            work, cl.world_size, cl.gpus_per_node, max_micro_batch=max_micro_batch
        )
        if allowed(run, c)
    ]
    if run.schedule:  # the paper names the whole layout
        stated = stated_layout(run)
        options = [e for e in options if e.candidate != stated] + [evaluate(work, stated, cl)]
    split = [
        e
        for e in options
        if (e.candidate.tp, e.candidate.pp) == (run.tp, run.pp)
        and (not run.micro_batch or e.candidate.micro_batch == run.micro_batch)
        and (not run.schedule or e.candidate == stated)
    ]
    fitting = [e for e in split if e.fits]
    published = (
        min(fitting, key=lambda e: e.time.step)  # type: ignore[union-attr]
        if fitting
        else min(split, key=lambda e: e.memory.total)
    )
    ranked = tie_ranked([e for e in options if e.fits])
    return Reproduced(run, work, published, ranked[0])
