"""`tpformer-pretrain`: pretrain BERT (MLM + NSP) or GPT at any layout.

tpformer-pretrain model=bert_mini parallel.tensor=2 launcher.nproc_per_node=2
torchrun --nproc_per_node 8 -m tpformer.cli.pretrain model=bert_base parallel.tensor=2
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

import hydra
from omegaconf import DictConfig

from tpformer.cli.inputs import prepare_pretrain
from tpformer.cli.shell import console_script, run_entry_point
from tpformer.config.overrides import checked_overrides
from tpformer.config.schema import Config
from tpformer.config.store import CONF_DIR, register_configs

if TYPE_CHECKING:
    from collections.abc import Sequence

    from tpformer.parallel.context import ParallelContext
    from tpformer.train.callbacks import Callback

log = logging.getLogger("tpformer")
register_configs()


def pretrain(
    config: Config, ctx: ParallelContext, run_dir: Path, callbacks: Sequence[Callback] = ()
) -> list[dict]:
    """The job on this rank (the console script's and the Python API's): the logged records."""
    # the training stack loads in the ranks: the launcher and a refused input never need it
    from tpformer.train.pretraining import pretraining_trainer

    trainer = pretraining_trainer(config, ctx, run_dir)
    trainer.callbacks.extend(callbacks)
    records = trainer.train()
    if records:
        log.info(
            "done: step %d, loss %.4f (first logged %.4f); metrics in %s",
            records[-1]["step"],
            records[-1]["loss"],
            records[0]["loss"],
            run_dir / "metrics.jsonl",
        )
    return records


@console_script
@checked_overrides(Config, "tpformer-pretrain", __doc__ or "", "config")
@hydra.main(version_base=None, config_path=CONF_DIR, config_name="config")
def main(cfg: DictConfig) -> None:
    run_entry_point(cfg, "tpformer.cli.pretrain", pretrain, prepare=prepare_pretrain)


if __name__ == "__main__":
    main()
