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
  comm_overlap=0); the attention core materialized its scores (rng exact).
- DeepSpeed ZeRO-3: one GPU per model replica (no tensor or pipeline parallelism), 16-bit
  gradients in buckets of 5e8 elements (its reduce_bucket_size default), communication
  overlapped (its overlap_comm), full recomputation.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from tpformer.config.schema import Activation, Arch, ModelConfig
from tpformer.planner.candidate import Candidate, Workload, enumerate_candidates
from tpformer.planner.cluster import Cluster, load_preset, resolve_cluster
from tpformer.planner.search import Evaluated, evaluate, tie_ranked

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
    """ptd-p (Megatron-LM 2021) or zero-3 (DeepSpeed ZeRO-3 without model parallelism)."""
    micro_batch: int = 0
    """The micro-batch the paper names (0: not given; the planner's best at that split)."""

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
        activation=Activation.gelu_tanh,
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
        rng="exact",
        grad_bytes=2 if zero3 else 4,
        bucket_elements=DEEPSPEED_BUCKET if zero3 else 0,
    )


def cluster(run: PublishedRun, preset: str = "a100_node") -> Cluster:
    """The preset with the run's node count; Megatron-LM 2021 did not overlap its DP all-reduce."""
    config = load_preset(preset)
    config = replace(
        config,
        nodes=max(1, run.gpus // config.gpus_per_node),
        calibration="none",
        comm_overlap=0.0 if run.scheme == "ptd-p" else config.comm_overlap,
    )
    return resolve_cluster(config, "bf16", cache_dir="/nonexistent")


def allowed(run: PublishedRun, c: Candidate) -> bool:
    """Whether a layout uses only the options the run's framework had."""
    common = c.recompute == "full" and not c.sequence_parallel and c.cpu_offload == "none"
    if run.scheme == "zero-3":
        return common and c.zero_stage == 3 and c.tp == c.pp == 1
    return common and c.zero_stage == 0


def paper_flops(work: Workload) -> float:
    """Model FLOPs per step by the paper's formula, 96 B s l h^2 (1 + s / 6h + V / 16 l h)
    (with the recomputed forward)."""
    m, s = work.model, work.seq
    h, n_layers = m.hidden_size, m.num_layers
    return (
        96
        * work.global_batch
        * s
        * n_layers
        * h
        * h
        * (1 + s / (6 * h) + m.vocab_size / (16 * n_layers * h))
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
        """Predicted / published TFLOP/s at the published layout (nan when it does not fit)."""
        if not self.published.fits:
            return float("nan")
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


def reproduce(run: PublishedRun, *, max_micro_batch: int = 16) -> Reproduced:
    """Price every layout of the run's workload on its cluster that its framework allowed."""
    work, cl = workload(run), cluster(run)
    options = [
        evaluate(work, c, cl)
        for c in enumerate_candidates(
            work, cl.world_size, cl.gpus_per_node, max_micro_batch=max_micro_batch
        )
        if allowed(run, c)
    ]
    split = [
        e
        for e in options
        if (e.candidate.tp, e.candidate.pp) == (run.tp, run.pp)
        and (not run.micro_batch or e.candidate.micro_batch == run.micro_batch)
    ]
    fitting = [e for e in split if e.fits]
    published = (
        min(fitting, key=lambda e: e.time.step)  # type: ignore[union-attr]
        if fitting
        else min(split, key=lambda e: e.memory.total)
    )
    ranked = tie_ranked([e for e in options if e.fits])
    return Reproduced(run, work, published, ranked[0])
