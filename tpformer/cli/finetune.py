"""`tpformer-finetune`: fine-tune BERT on a GLUE task at any layout.

tpformer-finetune task=rte init=runs/bert/checkpoints/step00000500 data.glue_dir=glue
tpformer-finetune task=sst2 init=path/to/hf_bert data.glue_dir=glue parallel.tensor=2
    launcher.nproc_per_node=2
tpformer-finetune task=sst2 init=path/to/hf_bert data.glue_dir=glue parallel.tensor=8
    parallel.pipeline=2 dry_run.world=64    (the step of ranks 0 and 32 of a 64-rank job,
    the first rank of each stage, on this CPU)
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING

import hydra
from omegaconf import DictConfig

from tpformer.cli.inputs import prepare_finetune
from tpformer.cli.plan_output import planned_lines
from tpformer.cli.shell import console_script, run_entry_point
from tpformer.config.overrides import checked_overrides
from tpformer.config.schema import FinetuneConfig
from tpformer.config.store import CONF_DIR, register_configs
from tpformer.config.validate import validate_finetune
from tpformer.parallel.layout import Layout
from tpformer.planner.candidate import candidate_of
from tpformer.planner.cluster import accelerator_cluster

if TYPE_CHECKING:
    from collections.abc import Sequence

    from tpformer.parallel.context import ParallelContext
    from tpformer.train.callbacks import Callback

log = logging.getLogger("tpformer")
register_configs()


def finetune(
    config: FinetuneConfig,
    ctx: ParallelContext,
    run_dir: Path,
    callbacks: Sequence[Callback] = (),
) -> dict:
    """The job on this rank (the console script's and the Python API's): results.json's
    contents."""
    # the training stack loads in the ranks: the launcher and a refused input never need it
    from tpformer.train.finetuning import finetuning_trainer, write_results

    start = time.perf_counter()
    trainer = finetuning_trainer(config, ctx, run_dir)
    trainer.callbacks.extend(callbacks)
    trainer.train()
    results = write_results(trainer, config, time.perf_counter() - start)
    best = results.get("best", {})
    log.info(
        "done: best dev %s at step %s in %.0f s; results in %s",
        {k: round(v, 4) for k, v in best.items() if k not in ("step", "epoch")},
        best.get("step"),
        results["wall_time_s"],
        run_dir / "results.json",
    )
    return results


def dry_runs(config: FinetuneConfig, layout: Layout) -> None:
    """dry_run.world: the fine-tuning step of dry_run.ranks (default: the first rank of the
    first and of the last stage) on this CPU, printed."""
    from tpformer.train.dry_run import dry_run_finetune, ranks_to_run  # the model and engine
    from tpformer.train.finetuning import finetuning_workload

    world = layout.world_size
    ranks = ranks_to_run(config.dry_run.ranks, layout, "dry_run.ranks")
    runs = [dry_run_finetune(config, world, rank) for rank in ranks]
    work, candidate = finetuning_workload(config), candidate_of(config, layout.dp)
    cluster = accelerator_cluster(world, str(config.parallel.precision))
    title = f"fine-tuning {config.task} on {world} ranks ({candidate.label()})"
    print("\n".join(planned_lines(title, work, candidate, cluster, runs)))
    print(
        f"    the planner prices batches of data.max_length={config.data.max_length} tokens; "
        "the dry run's are its first batches' width"
    )


@console_script
@checked_overrides(FinetuneConfig, "tpformer-finetune", __doc__ or "", "finetune")
@hydra.main(version_base=None, config_path=CONF_DIR, config_name="finetune")
def main(cfg: DictConfig) -> None:
    run_entry_point(
        cfg,
        "tpformer.cli.finetune",
        finetune,
        check=validate_finetune,
        prepare=prepare_finetune,
        dry=dry_runs,
    )


if __name__ == "__main__":
    main()
