"""`tpformer-plan`: which layout should this model use on these machines?

    tpformer-plan model=bert_large cluster=h100_node cluster.nodes=4 plan.global_batch=1024
    tpformer-plan --calibrate                  # measure this machine's constants first
    tpformer-plan --json model=bert_base ...   # for tools

Same Hydra config as tpformer-pretrain, plus the `cluster` group and `plan.*` options. Every
layout tpformer accepts is predicted (memory per rank, step time); the fastest that fit are
printed as the overrides that run them.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from typing import TYPE_CHECKING

from tpformer.cli.plan_output import (
    dry_run_lines,
    entry_json,
    format_evaluation,
    format_result,
    result_json,
)
from tpformer.cli.shell import console_script
from tpformer.config.help import given_overrides, help_requested, schema_help
from tpformer.config.overrides import compose_typed
from tpformer.config.rules.model import validate_model
from tpformer.config.schema import PlanConfig
from tpformer.config.validate import validate
from tpformer.parallel.layout import resolve_layout
from tpformer.planner.auto import at_layout, auto_global_batch
from tpformer.planner.candidate import Workload, candidate_of
from tpformer.planner.cluster import calibration_path, device_kind, resolve_cluster
from tpformer.planner.search import (
    Evaluated,
    PlanResult,
    evaluate,
    search,
)

if TYPE_CHECKING:
    from tpformer.train.dry_run import DryRun

LAYOUT_KEYS = (
    "parallel.tensor",
    "parallel.pipeline",
    "parallel.context",
    "parallel.data",
    "parallel.zero_stage",
    "parallel.cpu_offload",
    "parallel.sequence_parallel",
    "parallel.recompute",
    "parallel.pipeline_schedule",
    "trainer.micro_batch_size",
    "trainer.grad_accum",
    "launcher.nproc_per_node",
)


def _compose(overrides: list[str]) -> PlanConfig:
    config: PlanConfig = compose_typed("plan", PlanConfig, overrides)
    return config


def _user_overrides(overrides: list[str]) -> list[str]:
    """The user's overrides that a pretraining run takes (not the planner's or the layout's)."""
    return [
        o
        for o in overrides
        if not o.startswith(("cluster", "plan."))
        and o.split("=")[0].lstrip("+~") not in LAYOUT_KEYS
    ]


def given_layout_keys(overrides: list[str]) -> list[str]:
    """The layout keys the command line sets (auto is not a setting)."""
    return [
        o.split("=", 1)[0].lstrip("+~")
        for o in overrides
        if o.split("=", 1)[0].lstrip("+~") in LAYOUT_KEYS
        and o.split("=", 1)[0] != "launcher.nproc_per_node"
        and not o.endswith("=auto")
    ]


def evaluate_given(
    config: PlanConfig, result: PlanResult, *, device_type: str
) -> tuple[Evaluated, int | None]:
    """The configured layout on the cluster, priced, and its place in the ranking (None: not
    among the layouts that fit). A layout the run would refuse is a ValueError naming why."""
    p = config.parallel
    tp = int(p.tensor) if p.tensor != "auto" else 1
    pp = int(p.pipeline) if p.pipeline != "auto" else 1
    layout = resolve_layout(tp, p.data, result.cluster.world_size, pp, p.context)
    at = at_layout(config, tp, pp, result.work.global_batch)
    validate(at, layout, device_type=device_type)
    chosen = evaluate(result.work, candidate_of(at, layout.dp), result.cluster)
    place = next(
        (i for i, e in enumerate(result.ranked, 1) if e.candidate == chosen.candidate), None
    )
    return chosen, place


def _dry_runs(config: PlanConfig, result: PlanResult, chosen: Evaluated) -> list[DryRun]:
    """plan.dry_run: the chosen layout's step for plan.dry_run_ranks (default: the first rank
    of the first and of the last pipeline stage) of the cluster's world."""
    from tpformer.train.dry_run import dry_run, ranks_to_run  # the model and engine stack

    c, world = chosen.candidate, result.cluster.world_size
    at = at_layout(config, c.tp, c.pp, result.work.global_batch)
    layout = resolve_layout(c.tp, c.dp, world, c.pp, c.cp)
    ranks = ranks_to_run(config.plan.dry_run_ranks, layout, "plan.dry_run_ranks")
    return [dry_run(c.apply(at), world, rank) for rank in ranks]


def _refuse_replicated_stages(config: PlanConfig) -> None:
    """tpformer-plan prices regular layouts; PipeDream's replication is chosen in the run."""
    p = config.parallel
    if p.pipeline_replicas or p.pipeline_split == "pipedream":
        given = (
            f"parallel.pipeline_replicas={list(p.pipeline_replicas)}"
            if p.pipeline_replicas
            else "parallel.pipeline_split=pipedream"
        )
        raise ValueError(
            f"{given}: tpformer-plan prices regular tensor x pipeline x data layouts; "
            "replicated pipeline stages are chosen by PipeDream's partitioner in the run "
            "itself (tools/pipedream_partition.py shows its choice)"
        )


def _calibrate(config: PlanConfig, precision: str) -> None:
    """--calibrate: measure this machine's constants and write them where cluster= finds them."""
    import torch

    from tpformer.planner.calibrate import calibrate

    kind = device_kind()
    name = kind if config.cluster.name == "auto" else config.cluster.name
    if name != kind:
        raise ValueError(
            f"--calibrate measures this machine ({kind}); cluster={name} "
            f"describes other hardware: use cluster=auto or cluster={kind}"
        )
    uncalibrated = resolve_cluster(
        dataclasses.replace(config.cluster, calibration="none"),
        precision,
        cache_dir=config.data.cache_dir,
    )
    measured = calibrate(
        uncalibrated,
        precision,
        torch.device("cuda" if kind != "cpu" else "cpu"),
        collectives=kind == "cpu",
    )
    path = calibration_path(config.data.cache_dir, name)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(measured, indent=1))
    print(f"calibration of {name} written to {path}", file=sys.stderr)


def plan(
    config: PlanConfig,
    overrides: list[str],
    *,
    as_json: bool,
    do_calibrate: bool,
    every: bool = False,
) -> str:
    precision = str(config.parallel.precision)
    _refuse_replicated_stages(config)
    if do_calibrate:
        _calibrate(config, precision)
    cluster = resolve_cluster(config.cluster, precision, cache_dir=config.data.cache_dir)
    validate_model(config.model, 1)
    if config.data.seq_length > config.model.max_position_embeddings:
        raise ValueError(
            f"data.seq_length={config.data.seq_length} exceeds "
            f"model.max_position_embeddings={config.model.max_position_embeddings}"
        )
    device_type = "cpu" if cluster.name == "cpu" else "cuda"
    global_batch = config.plan.global_batch or auto_global_batch(config, cluster.world_size)
    model_name = next(
        (o.split("=", 1)[1] for o in overrides if o.startswith("model=")), "bert_mini"
    )
    work = Workload.of(config, global_batch, model_name)
    start = time.perf_counter()
    result = search(
        work, cluster, max_micro_batch=config.plan.max_micro_batch, device_type=device_type
    )
    seconds = time.perf_counter() - start
    for e in result.ranked[: config.plan.top]:  # what is recommended, the run itself accepts
        c = e.candidate
        validate(
            c.apply(config),
            resolve_layout(c.tp, c.dp, cluster.world_size, c.pp, c.cp),
            device_type=device_type,
        )
    base = _user_overrides(overrides)
    keys = given_layout_keys(overrides)
    if keys or config.plan.evaluate or config.plan.dry_run:
        chosen, place = evaluate_given(config, result, device_type=device_type)
        runs = _dry_runs(config, result, chosen) if config.plan.dry_run else []
        if as_json:
            data = result_json(result, config.plan.top, base, every=every)
            data["evaluated"] = {**entry_json(chosen, result), "rank": place}
            if runs:
                data["dry_run"] = [dataclasses.asdict(r) for r in runs]
            return json.dumps(data, indent=1)
        text = format_evaluation(result, chosen, place, keys, base, model_name, seconds)
        return "\n".join([text, *dry_run_lines(result, chosen, runs)]) if runs else text
    if as_json:
        return json.dumps(result_json(result, config.plan.top, base, every=every), indent=1)
    return format_result(result, config.plan.top, base, model_name, seconds)


@console_script
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="tpformer-plan",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    parser.add_argument(
        "--calibrate",
        action="store_true",
        help="measure this machine's constants and store them for its preset",
    )
    parser.add_argument(
        "--all",
        action="store_true",
        help="with --json: every enumerated layout, with its numbers or why it does not fit",
    )
    parser.add_argument("overrides", nargs="*", help="Hydra overrides (key=value)")
    given = sys.argv[1:] if argv is None else argv
    if help_requested(given)[0]:  # every key of the plan's config, as the run would take it
        overrides = given_overrides(given)
        parser.epilog = schema_help("tpformer-plan", "", PlanConfig, "plan", None, overrides)
    args = parser.parse_args(argv)
    config = _compose(args.overrides)
    print(
        plan(
            config,
            args.overrides,
            as_json=args.json,
            do_calibrate=args.calibrate,
            every=args.all,
        )
    )


if __name__ == "__main__":
    main()
