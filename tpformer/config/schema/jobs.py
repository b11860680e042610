"""The top-level configs of each console script, composed of the groups."""

from __future__ import annotations

from dataclasses import dataclass, field

from tpformer.config.schema.choices import MISSING, FinetuneTaskName, SamplingMode, ranged
from tpformer.config.schema.cluster import ClusterConfig
from tpformer.config.schema.data import DataConfig, GlueDataConfig
from tpformer.config.schema.model import ModelConfig
from tpformer.config.schema.optim import OptimConfig
from tpformer.config.schema.parallel import ParallelConfig
from tpformer.config.schema.trainer import FinetuneTrainerConfig, LauncherConfig, TrainerConfig


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
    dry_run: bool = False
    """Also run the configured layout's real training step for chosen ranks on this CPU (the
    fake process-group backend, the meta device: no data, any world size) and print what each
    holds and sends next to the planner's prediction (implies plan.evaluate)."""
    dry_run_ranks: list[int] = field(default_factory=list)
    """Global ranks of plan.dry_run ([]: the first rank of the first and of the last stage)."""


@dataclass
class PlanConfig(Config):
    """tpformer-plan: the pretraining config, its cluster, and the search's options."""

    plan: PlanOptions = field(default_factory=PlanOptions)


@dataclass
class FinetuneModelConfig:
    """The model keys fine-tuning may set over its init's; every other one (the shape) comes
    from init, as from_pretrained takes it from config.json."""

    dropout: float | None = ranged(None, 0, 1, hi_open=True)
    """Dropout on embeddings and residual branches (null: init's)."""
    attention_dropout: float | None = ranged(None, 0, 1, hi_open=True)
    """Dropout on attention probabilities (null: init's)."""

    def given(self) -> dict[str, float]:
        """The keys set (not null), as ModelConfig fields over init's."""
        keys = {"dropout": self.dropout, "attention_dropout": self.attention_dropout}
        return {k: v for k, v in keys.items() if v is not None}


@dataclass
class DryRunConfig:
    """A dry run in place of the job: its real training step, for chosen ranks of a job of any
    size, on this CPU (the fake process-group backend, the meta device), printing what each
    rank holds, computes and sends (docs/planner.md, "Dry runs")."""

    world: int = ranged(0, 0)
    """Ranks of the job the dry run stands for (0: run the job itself); the layout keys
    (parallel.*) are resolved for this world."""
    ranks: list[int] = field(default_factory=list)
    """Global ranks to dry-run ([]: the first rank of the first and of the last stage)."""


@dataclass
class FinetuneConfig:
    """tpformer-finetune: a GLUE task, or a classifier or regressor on your own files, from a
    tpformer checkpoint or a Hugging Face BERT."""

    task: FinetuneTaskName = MISSING
    """cola, sst2, mrpc, stsb, qqp, mnli, qnli, rte or wnli (GLUE); classification,
    regression or multilabel on your own files (data.train_file, data.dev_file,
    data.text_column, ...)."""
    init: str = MISSING
    """A tpformer checkpoint directory (checkpoints/stepN), a Hugging Face BERT directory, or a
    Hugging Face Hub id (bert-base-uncased, org/name@revision; resolved through its cache)."""
    model: FinetuneModelConfig = field(default_factory=FinetuneModelConfig)
    data: GlueDataConfig = field(default_factory=GlueDataConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    trainer: FinetuneTrainerConfig = field(default_factory=FinetuneTrainerConfig)
    launcher: LauncherConfig = field(default_factory=LauncherConfig)
    dry_run: DryRunConfig = field(default_factory=DryRunConfig)


@dataclass
class GenerateConfig:
    """tpformer-generate: completions from a GPT checkpoint or a Hugging Face GPT-2 directory."""

    init: str = MISSING
    """A tpformer GPT checkpoint directory (checkpoints/stepN), a Hugging Face GPT-2 directory
    (save_pretrained), or a Hugging Face Hub id (gpt2, org/name@revision; resolved through its
    cache)."""
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
    """A tpformer GPT checkpoint directory, a Hugging Face GPT-2 directory, or a Hugging Face Hub
    id (gpt2, org/name@revision)."""
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
