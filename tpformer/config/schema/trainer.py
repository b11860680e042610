"""The trainer and launcher groups: the loop's steps, logging, checkpoints and stops."""

from __future__ import annotations

from dataclasses import dataclass, field

from tpformer.config.schema.choices import Logger, ranged


@dataclass
class ProfileConfig:
    """A torch.profiler trace of a window of steps (docs: Logging and progress)."""

    start: int = ranged(0, 0)
    """First traced step, counted as the progress bar counts (0: no profiling)."""
    steps: int = ranged(3, 1)
    """Steps traced from `start`."""
    warmup: int = ranged(1, 0)
    """Steps before `start` the profiler runs untraced (its own start-up cost stays out)."""
    ranks: list[int] = field(default_factory=lambda: [0])
    """Global ranks that trace ([]: every rank); each writes <run dir>/profile/rank<R>.*."""
    memory: bool = True
    """On CUDA, also a memory snapshot of the window (rank<R>_memory.pickle, for
    pytorch.org/memory_viz) and the profiler's per-operator memory."""


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
    profile: ProfileConfig = field(default_factory=ProfileConfig)
    """A torch.profiler trace of a window of steps (trainer.profile.start=N; 0: off)."""
    loggers: list[Logger] = field(default_factory=lambda: [Logger.tensorboard])
    """Where the scalars of metrics.jsonl also go: tensorboard (<run dir>/tensorboard), wandb
    (Weights & Biases, with the composed config; pip install 'tpformer[wandb]'; WANDB_PROJECT,
    WANDB_MODE=offline and its other variables apply). [] for metrics.jsonl alone."""
    plot: bool = True
    """Rank 0 draws <run dir>/loss_curve.png from metrics.jsonl when the run ends (about half a
    second with matplotlib's import; tools/compare_loss_curve.py draws it beside a reference
    later)."""
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
class FinetuneTrainerConfig(LoopConfig):
    """Fine-tuning: epochs over the training split, dev evaluation after each; the best
    checkpoint by the task's first dev metric is kept in <run dir>/best."""

    epochs: float = ranged(3.0, 0, lo_open=True)
    """Passes over the training split (fractions allowed); the LR schedule ends here."""
    batch_size: int = ranged(32, 1)
    """Global batch (examples per optimizer step, over all DP ranks)."""
    micro_batch_size: int = ranged(0, 0)
    """Examples per DP rank per forward (0: batch_size / dp, no accumulation)."""
