"""The one shell every console script runs in: bad input (a Hydra typo, an invalid value, a
missing file) exits 2 with one line; a bug keeps its traceback and exits 1. For the training
entry points it also does what surrounds the job: launch, agree on the run directory, validate,
set up logging and save the config once."""

from __future__ import annotations

import functools
import logging
import shutil
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

from hydra.core.hydra_config import HydraConfig
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from tpformer.cli.failures import after_a_lost_peer, lost_a_peer, record_failure
from tpformer.cli.launch import launch_local
from tpformer.config.renamed import check_renamed
from tpformer.config.rules.choices import check_choices
from tpformer.config.schema import Config
from tpformer.config.store import to_config
from tpformer.config.validate import validate
from tpformer.parallel.comm import broadcast_object
from tpformer.parallel.context import ParallelContext
from tpformer.parallel.env import LaunchEnv
from tpformer.parallel.hang_report import enable_nccl_flight_recorder, gather_summary, write_report
from tpformer.parallel.layout import (
    Layout,
    provisional_replicas,
    replicated_layout,
    resolve_layout,
)
from tpformer.planner.auto import (
    apply_auto_layout,
    auto_keys,
    auto_label,
    check_degree,
    choose_layout,
)

log = logging.getLogger("tpformer")


def setup_logging(run_dir: Path, rank: int) -> None:
    """Rank 0 logs INFO to the console and run_dir/train.log; other ranks only warnings."""
    root = logging.getLogger()
    root.handlers.clear()
    fmt = logging.Formatter(
        f"[%(asctime)s rank {rank}] %(levelname)s %(name)s: %(message)s", "%H:%M:%S"
    )
    console = logging.StreamHandler(sys.stderr)
    console.setFormatter(fmt)
    root.addHandler(console)
    if rank == 0:
        file = logging.FileHandler(run_dir / "train.log")
        file.setFormatter(fmt)
        root.addHandler(file)
    root.setLevel(logging.INFO if rank == 0 else logging.WARNING)


def resolve(config: Any, world_size: int) -> Layout:
    """The run's layout for this world size (see resolve_run_layout)."""
    return resolve_run_layout(config, world_size)[0]


def resolve_run_layout(
    config: Any, world_size: int, local_world_size: int | None = None
) -> tuple[Layout, list[str]]:
    """The run's layout for this world size and the startup plan's lines on how it was chosen:
    the one place the layout keys are read, before any process group exists. parallel.data=auto
    is world / (tensor x pipeline x context); parallel.tensor / pipeline = auto are chosen by the
    planner and written into `config` (with the global batch they were compared at)."""
    p = config.parallel
    check_degree("tensor", p.tensor)
    check_degree("pipeline", p.pipeline)
    notes: list[str] = []
    keys = auto_keys(config)
    replicated = bool(p.pipeline_replicas) or p.pipeline_split == "pipedream"
    if keys and replicated:
        raise ValueError(
            f"{auto_label(keys)}: the planner chooses regular layouts; with replicated "
            "pipeline stages (parallel.pipeline_replicas, parallel.pipeline_split=pipedream) "
            "give parallel.tensor=1 and parallel.pipeline as an integer"
        )
    if keys:
        if not isinstance(config, Config):
            raise ValueError(
                f"{auto_label(keys)}: the planner chooses layouts for "
                "pretraining runs; give fine-tuning integer degrees (e.g. parallel.tensor=2)"
            )
        choice = choose_layout(
            config, world_size, local_world_size or world_size, device_type=_device_type()
        )
        apply_auto_layout(config, choice)
        notes = choice.describe(keys)
    if replicated:
        return replicated_layout(
            list(p.pipeline_replicas) or provisional_replicas(world_size, int(p.pipeline)),
            world_size,
            tensor=p.tensor,
            data=p.data,
            context=p.context,
            pipeline=int(p.pipeline),
        ), notes
    return resolve_layout(p.tensor, p.data, world_size, p.pipeline, p.context), notes


def _fail(message: str) -> NoReturn:
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


class _JobState:
    """Whether Hydra got as far as calling the job: an exit before that is a config error."""

    started = False


USAGE_ERRORS = (
    ValueError,
    FileNotFoundError,
    ModuleNotFoundError,
    HydraException,
    OmegaConfBaseException,
)
"""What a console script raises for bad input before it starts its work: exit 2, one line."""


def console_script(main: Callable[..., None]) -> Callable[..., None]:
    """The wrapper of every console script (`[project.scripts]` points at its result).

    A config that Hydra rejects while composing (a typo, a wrong type, a value outside a key's
    choices) exits 2, not Hydra's 1; Hydra has already printed its one-line message. A
    USAGE_ERRORS exception that reaches here exits 2 with its message on one line. Anything
    else is a bug: it keeps its traceback and exits 1.
    """

    @functools.wraps(main)
    def wrapped(*args: Any, **kwargs: Any) -> None:
        _JobState.started = False  # a call of its own (a rank forked from its launcher is one)
        try:
            check_renamed(sys.argv[1:])
            main(*args, **kwargs)
        except SystemExit as exit_:
            if exit_.code == 1 and not _JobState.started:
                sys.exit(2)
            raise
        except USAGE_ERRORS as err:
            message = " ".join(line.strip() for line in str(err).splitlines() if line.strip())
            _fail(message or type(err).__name__)

    return wrapped


Prepare = Callable[[Any, Sequence[str], Path], list[str]]
"""An entry point's reading of its inputs before the layout: (typed config, command-line
overrides, run directory) -> lines to log; raises ValueError / FileNotFoundError on bad input."""


def _checked_config(
    cfg: DictConfig, env: LaunchEnv, check: Callable[..., None], prepare: Prepare | None
) -> tuple[Any, Layout, list[str], bool]:
    """(typed config, layout, lines on where its model and layout came from, whether to
    relaunch on N local ranks), the config validated at the layout of this world (or of the N
    ranks a relaunch starts)."""
    config = to_config(cfg)
    check_choices(config)  # every key's range and choices, before reading any file
    hydra_cfg = HydraConfig.get()
    run_dir = Path(hydra_cfg.runtime.output_dir)
    read = prepare(config, list(hydra_cfg.overrides.task), run_dir) if prepare else []
    relaunch = not env.under_launcher and config.launcher.nproc_per_node > 1
    nproc = config.launcher.nproc_per_node
    world, local = (nproc, nproc) if relaunch else (env.world_size, env.local_world_size)
    dry = dry_world(config)
    if dry:  # the layout of the job the dry run stands for; nothing is launched
        world, local, relaunch = dry, dry, False
    layout, notes = checked_layout(config, world, local, check)
    return config, layout, read + notes, relaunch


DEFAULT_RUN_ROOTS = ("outputs", "multirun")
"""Where the configs' default hydra.run.dir patterns put a run, under the working directory."""


def _forget_run_dir(run_dir: Path) -> None:
    """Remove the run directory Hydra made, from its default pattern, for a run that never
    started (only Hydra's own, empty files in it), and the empty folders above it up to the
    working directory. A directory the user named (hydra.run.dir) is left alone."""
    cwd = Path.cwd().resolve()
    run_dir = run_dir.resolve()
    if not run_dir.is_dir() or not run_dir.is_relative_to(cwd) or run_dir == cwd:
        return
    if run_dir.relative_to(cwd).parts[0] not in DEFAULT_RUN_ROOTS:
        return
    entries = list(run_dir.iterdir())
    if any(p.name != ".hydra" and not (p.is_file() and p.name.endswith(".log")) for p in entries):
        return
    if any(p.is_file() and p.stat().st_size for p in entries):
        return
    shutil.rmtree(run_dir, ignore_errors=True)
    parent = run_dir.parent
    while parent != cwd and parent.is_relative_to(cwd) and not any(parent.iterdir()):
        parent.rmdir()
        parent = parent.parent


def dry_world(config: Any) -> int:
    """The ranks of the job a dry run stands for (dry_run.world), 0 for a job that runs."""
    dry = getattr(config, "dry_run", None)
    return int(getattr(dry, "world", 0) or 0)


def run_entry_point(
    cfg: DictConfig,
    module: str,
    job: Callable[[Any, ParallelContext, Path], object],
    check: Callable[..., None] = validate,
    prepare: Prepare | None = None,
    dry: Callable[[Any, Layout], None] | None = None,
) -> None:
    """The body of a @hydra.main: relaunch on N ranks, or run `job` on this rank. `prepare`
    reads the job's inputs (its checkpoint's model, its files), the layout is resolved once,
    here, and `check` validates the typed config at that layout before any process group
    exists. With dry_run.world set, `dry(config, layout)` runs in this process instead."""
    _JobState.started = True
    hydra_cfg = HydraConfig.get()
    run_dir = Path(hydra_cfg.runtime.output_dir)
    env = LaunchEnv.read()  # the one read of the launcher's variables
    try:
        config, layout, notes, relaunch = _checked_config(cfg, env, check, prepare)
    except Exception as err:  # a config error: one line, and no run directory left behind
        _forget_run_dir(run_dir)
        lines = [line.strip() for line in str(err).splitlines() if line.strip()]
        # OmegaConf's errors add lines of its internals (full_key, object_type) after the first
        shown = lines[:1] if isinstance(err, OmegaConfBaseException) else lines
        _fail(" ".join(shown) or type(err).__name__)
    if dry is not None and dry_world(config):
        _run_dry(dry, config, layout, run_dir)
        return
    if relaunch:
        overrides = [*hydra_cfg.overrides.task, f"hydra.run.dir={run_dir}"]
        code = launch_local(
            module,
            overrides,
            nproc_per_node=config.launcher.nproc_per_node,
            max_restarts=config.launcher.max_restarts,
            run_dir=run_dir,
        )
        if code:
            sys.exit(code)
        return
    ctx = rank_context(config, layout, env, run_dir)
    shared = run_dir
    try:
        shared = shared_run_dir(cfg, hydra_cfg.overrides.task, run_dir, ctx)
        for line in notes:
            log.info("%s", line)
        job(config, ctx, shared)
    except JOB_ERRORS as err:  # bad data or checkpoints, failed writes: one line, no traceback
        record_failure(env, ctx.rank, " ".join(str(err).split()) or type(err).__name__)
        sys.exit(1)
    except RuntimeError as err:
        if lost_a_peer(err):
            after_a_lost_peer(ctx.rank, err)
        if "timed out" not in str(err).lower() and "timeout" not in str(err).lower():
            raise
        report_collective_timeout(ctx, shared, err, config.launcher.timeout_s)
        sys.exit(1)
    finally:
        ctx.destroy()


def _run_dry(
    dry: Callable[[Any, Layout], None], config: Any, layout: Layout, run_dir: Path
) -> None:
    """The dry run in place of the job: a bad rank is a config error; no run directory stays."""
    try:
        dry(config, layout)
    except ValueError as err:
        _fail(str(err))
    finally:
        _forget_run_dir(run_dir)


def rank_context(config: Any, layout: Layout, env: LaunchEnv, run_dir: Path) -> ParallelContext:
    """This rank's context: the process groups of `layout` under a launcher, else one process."""
    if not env.under_launcher:
        return ParallelContext.single(seed=config.parallel.seed, rng=config.parallel.rng)
    die_with_parent()
    enable_nccl_flight_recorder(run_dir)
    return ParallelContext.create(
        layout.tp,
        layout.dp,
        seed=config.parallel.seed,
        env=env,
        timeout_s=config.launcher.timeout_s,
        sequence_parallel=config.parallel.sequence_parallel,
        pipeline=layout.pp,
        rng=config.parallel.rng,
        gloo_shortcuts=config.parallel.gloo_shortcuts,
        context=layout.cp,
        replicas=layout.stage_workers,
    )


def report_collective_timeout(
    ctx: ParallelContext, run_dir: Path, err: Exception, timeout_s: float
) -> None:
    """Log the timeout, write this rank's hang report and, on global rank 0, the summary line
    (once the other ranks' reports are in, or after a few seconds without them)."""
    reason = str(err).strip().splitlines()[-1]
    report = write_report(run_dir, ctx.rank, reason, ctx.monitor.recorder)
    log.error(
        "a collective timed out after launcher.timeout_s=%s s: another rank of this job "
        "stopped making progress (stopped, deadlocked, or stuck in I/O) [%s]; this rank's last "
        "collectives and stacks: %s",
        timeout_s,
        reason,
        report,
    )
    if ctx.rank == 0:  # reports of this hang: written within one timeout of this rank's
        since = report.stat().st_mtime - timeout_s
        log.error("%s", gather_summary(run_dir, ctx.layout.world_size, since))


JOB_ERRORS = (ValueError, FileNotFoundError, OSError, FloatingPointError)
"""What a job raises for bad input (data, checkpoints, tokenizers), a failed write or a diverged
loss: reported as one line. Anything else is a bug and keeps its traceback."""


def die_with_parent() -> None:
    """Linux: this rank gets SIGKILL when its launcher dies, so killing the launcher (even with
    SIGKILL) takes its ranks with it; torch's launcher starts each rank in a session of its own,
    out of reach of the launcher's process group."""
    try:
        import ctypes
        import signal

        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: ranks outlive a killed launcher
        pass


def checked_layout(
    config: Any, world_size: int, local_world_size: int, check: Callable[..., None]
) -> tuple[Layout, list[str]]:
    """The layout for this world size and how it was chosen, with the config validated at it
    (ValueError if invalid)."""
    layout, notes = resolve_run_layout(config, world_size, local_world_size)
    check(config, layout, device_type=_device_type())
    if config.parallel.precision == "fp8" and _device_type() == "cuda":
        _require_fp8_matmuls()
    return layout, notes


def _require_fp8_matmuls() -> None:
    """parallel.precision=fp8 on this machine's GPU: one with fp8 matmuls (a hardware check of
    the run, not a config rule: tpformer-plan plans fp8 for GPUs it does not run on)."""
    import torch

    capability = torch.cuda.get_device_capability()
    if capability < (8, 9):
        raise ValueError(
            f"parallel.precision=fp8 needs GPUs with fp8 matmuls (compute capability 8.9 or "
            f"newer: L4, L40S, H100, H200, B200); {torch.cuda.get_device_name()} has "
            f"{capability[0]}.{capability[1]}: use parallel.precision=bf16"
        )


def shared_run_dir(
    cfg: DictConfig, overrides: Sequence[str], run_dir: Path, ctx: ParallelContext
) -> Path:
    """Rank 0's run directory for every rank (their ${now} may differ), with logging set up and
    the composed config (and the overrides that made it) saved once into it."""
    shared = Path(broadcast_object(str(run_dir), monitor=ctx.monitor))  # type: ignore[arg-type]
    if shared != run_dir and run_dir.exists() and not any(run_dir.iterdir()):
        shutil.rmtree(run_dir, ignore_errors=True)  # this rank's ${now} differed: drop it
    shared.mkdir(parents=True, exist_ok=True)
    setup_logging(shared, ctx.rank)
    if ctx.is_main:
        hydra_dir = shared / ".hydra"
        hydra_dir.mkdir(exist_ok=True)
        OmegaConf.save(cfg, hydra_dir / "config.yaml")
        OmegaConf.save(OmegaConf.create(list(overrides)), hydra_dir / "overrides.yaml")
        log.info("run directory: %s", shared.resolve())
    return shared


def _device_type() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"
