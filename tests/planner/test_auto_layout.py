"""parallel.tensor=auto / parallel.pipeline=auto: the run's degrees come from the planner, with
every other key as the user set it, the same on every call (every rank derives the layout on
its own), and typos or impossible requests fail with the reason."""

from __future__ import annotations

import pytest

from tests.config.test_config import compose_config
from tpformer.cli.shell import resolve_run_layout
from tpformer.config.schema import Config, FinetuneConfig
from tpformer.planner.auto import auto_global_batch
from tpformer.planner.candidate import Workload
from tpformer.planner.cluster import resolve_cluster
from tpformer.planner.search import search

BASE = ("model=bert_mini", "cluster=a100_node", "data.seq_length=128")


def _expected(config: Config, world: int, global_batch: int) -> tuple[int, int]:
    """The planner's own ranking over every layout of the workload (tpformer-plan's search),
    kept to those with the user's keys: the fastest one's degrees."""
    p, t = config.parallel, config.trainer
    cluster = resolve_cluster(config.cluster, str(p.precision), cache_dir=config.data.cache_dir)
    result = search(Workload.of(config, global_batch), cluster, device_type="cuda")
    for e in result.ranked:
        c = e.candidate
        if (
            c.micro_batch == t.micro_batch_size
            and c.zero_stage == int(p.zero_stage)
            and c.cpu_offload == str(p.cpu_offload)
            and c.sequence_parallel == p.sequence_parallel
            and c.recompute == str(p.recompute)
            and (c.pp == 1 or c.schedule == str(p.pipeline_schedule))
            and (p.tensor == "auto" or c.tp == p.tensor)
            and (p.pipeline == "auto" or c.pp == p.pipeline)
        ):
            return c.tp, c.pp
    raise AssertionError("no candidate of the search matches the pinned keys")


@pytest.mark.sweep
@pytest.mark.parametrize(
    "overrides",
    [
        ("parallel.tensor=auto",),
        ("parallel.tensor=auto", "parallel.pipeline=auto"),
        ("parallel.tensor=auto", "parallel.pipeline=auto", "parallel.zero_stage=1"),
        ("parallel.pipeline=auto", "parallel.tensor=2", "parallel.recompute=full"),
        ("parallel.tensor=auto", "parallel.sequence_parallel=true", "parallel.precision=bf16"),
        (
            "model=bert_large",
            "data.seq_length=512",
            "trainer.micro_batch_size=16",
            "parallel.tensor=auto",
            "parallel.pipeline=auto",
        ),
    ],
)
def test_auto_takes_the_planners_fastest_layout_with_the_pinned_keys(
    overrides: tuple[str, ...],
) -> None:
    """On a simulated 8-GPU A100 node (its preset constants), global batch 64 at micro-batch
    4 (bert_large: 16, where tensor=2 wins): the chosen degrees are those of the best layout
    tpformer-plan's search ranks among the layouts with the user's other keys, and those keys
    are left as they were."""
    given = (*BASE, "trainer.global_batch_size=64", "trainer.micro_batch_size=4", *overrides)
    config = compose_config(*given)
    pinned = compose_config(*given).parallel
    layout, notes = resolve_run_layout(config, 8, 8)
    assert (layout.tp, layout.pp) == _expected(compose_config(*given), 8, 64)
    assert (config.parallel.tensor, config.parallel.pipeline) == (layout.tp, layout.pp)
    assert (
        layout.world_size == 8
        and layout.dp * config.trainer.micro_batch_size * (config.trainer.grad_accum) == 64
    )
    for key in ("zero_stage", "precision", "sequence_parallel", "recompute"):
        assert getattr(config.parallel, key) == getattr(pinned, key), key
    assert "chose tensor=" in notes[0] and "runner-up: tensor=" in notes[1], notes
    again = compose_config(*given)
    assert resolve_run_layout(again, 8, 8)[0] == layout  # what every rank derives


def test_sequence_parallelism_pinned_on_excludes_tensor_1() -> None:
    config = compose_config(
        *BASE, "parallel.tensor=auto", "parallel.sequence_parallel=true", "trainer.grad_accum=2"
    )
    layout, _ = resolve_run_layout(config, 4, 4)
    assert layout.tp > 1


def test_without_a_global_batch_the_configured_product_is_kept() -> None:
    """global_batch_size=0: layouts are compared at micro x accum x world (auto counted as 1),
    and the chosen one trains that batch."""
    config = compose_config(*BASE, "parallel.tensor=auto", "trainer.micro_batch_size=2")
    assert auto_global_batch(config, 4) == 2 * 1 * 4
    layout, _ = resolve_run_layout(config, 4, 4)
    assert config.trainer.micro_batch_size * config.trainer.grad_accum * layout.dp == 8


def test_a_typo_in_a_degree_names_the_valid_values() -> None:
    config = compose_config(*BASE, "parallel.tensor=atuo")
    with pytest.raises(ValueError, match=r"parallel.tensor='atuo' must be a positive integer or"):
        resolve_run_layout(config, 2)


def test_no_valid_degree_says_why() -> None:
    """A global batch no data-parallel degree of the world divides at this micro-batch."""
    config = compose_config(
        *BASE, "parallel.tensor=auto", "trainer.global_batch_size=6", "trainer.micro_batch_size=4"
    )
    with pytest.raises(ValueError, match=r"parallel.tensor=auto: no layout of world 4 is valid"):
        resolve_run_layout(config, 4, 4)


def test_fine_tuning_needs_integer_degrees() -> None:
    config = FinetuneConfig()
    config.parallel.tensor = "auto"
    with pytest.raises(ValueError, match="give fine-tuning integer degrees"):
        resolve_run_layout(config, 2)
