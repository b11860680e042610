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
from dataclasses import asdict

from hydra import compose, initialize_config_dir

from tpformer.cli.shell import console_script
from tpformer.config.schema import PlanConfig
from tpformer.config.store import CONF_DIR, register_configs, to_config
from tpformer.config.validate import validate, validate_model
from tpformer.parallel.layout import resolve_layout
from tpformer.planner.auto import at_layout, auto_global_batch
from tpformer.planner.candidate import Candidate, Workload, candidate_of
from tpformer.planner.cluster import Cluster, calibration_path, device_kind, resolve_cluster
from tpformer.planner.memory import stage_params
from tpformer.planner.search import (
    GB,
    MODEL_ERROR,
    Evaluated,
    PlanResult,
    best_per_family,
    distinct_splits,
    evaluate,
    search,
    why_not,
)

LAYOUT_KEYS = (
    "parallel.tensor",
    "parallel.pipeline",
    "parallel.context",
    "parallel.data",
    "parallel.zero_stage",
    "parallel.cpu_offload",
    "parallel.sequence_parallel",
    "parallel.activation_checkpointing",
    "parallel.pipeline_schedule",
    "trainer.micro_batch_size",
    "trainer.grad_accum",
    "launcher.nproc_per_node",
)


def _compose(overrides: list[str]) -> PlanConfig:
    register_configs()
    with initialize_config_dir(config_dir=CONF_DIR, version_base=None):
        cfg = compose("plan", overrides=overrides)
    return to_config(cfg)


def _user_overrides(overrides: list[str]) -> list[str]:
    """The user's overrides that a pretraining run takes (not the planner's or the layout's)."""
    return [
        o
        for o in overrides
        if not o.startswith(("cluster", "plan."))
        and o.split("=")[0].lstrip("+~") not in LAYOUT_KEYS
    ]


def launch_line(c: Candidate, cluster: Cluster, base: list[str], layout: bool = True) -> str:
    args = " ".join([*base, *(c.overrides() if layout else [])])
    world = c.tp * c.pp * c.dp * c.cp
    if cluster.nodes == 1 or world <= cluster.gpus_per_node:
        return f"tpformer-pretrain {args} launcher.nproc_per_node={world}"
    nodes = world // cluster.gpus_per_node
    return (
        f"torchrun --nnodes {nodes} --nproc_per_node {cluster.gpus_per_node} "
        f"--rdzv_backend c10d --rdzv_endpoint $HEAD:29500 -m tpformer.cli.pretrain {args}"
    )


def confirm_lines(top: list[Evaluated], cluster: Cluster, base: list[str]) -> list[str]:
    """Short runs of the top layouts, each its own command: a Hydra `-m` sweep takes the
    product of the values listed, which would mix these layouts into others (and, through
    micro-batch x accumulation, change the global batch). Where the layouts differ in one key
    only, that sweep is exact and is given instead."""
    runs = [[*e.candidate.overrides(explicit=True), "trainer.max_steps=20"] for e in top]
    differing = {o.split("=")[0] for r in runs for o in r} - set(runs[0]).intersection(*runs[1:])
    if len(top) > 1 and len(differing) == 1 and cluster.world_size <= cluster.gpus_per_node:
        key = differing.pop()
        values = [next(o.split("=", 1)[1] for o in r if o.startswith(key + "=")) for r in runs]
        line = [o for o in runs[0] if not o.startswith(key + "=")] + [f"{key}={','.join(values)}"]
        return [
            launch_line(top[0].candidate, cluster, [*base, *line], layout=False).replace(
                "tpformer-pretrain ", "tpformer-pretrain -m ", 1
            )
        ]
    return [launch_line(e.candidate, cluster, [*base, "trainer.max_steps=20"]) for e in top]


def _row(i: int, e: Evaluated, result: PlanResult) -> str:
    t = e.time
    assert t is not None
    return (
        f"{i:>3}  {e.candidate.label():<34} {e.memory.total / GB:>8.2f} GB "
        f"{t.step:>9.4g} s {t.tokens_per_s(result.work):>11,.0f} {t.mfu(result.cluster):>6.1%}"
        f"  {'-' if i == 1 else why_not(result, e)}"
    )


def _header(result: PlanResult, model_name: str, seconds: float) -> list[str]:
    w, cl = result.work, result.cluster
    params = sum(s.total for s in stage_params(w, Candidate(1, 1, 1, 1, 1)))
    link = (
        f"intra-node {cl.intra.bandwidth / 1e9:g} GB/s, "
        f"inter-node {cl.inter.bandwidth / 1e9:g} GB/s"
    )
    return [
        f"workload: {model_name} ({w.model.num_layers} layers, hidden {w.model.hidden_size}, "
        f"{params / 1e6:,.0f}M parameters), seq {w.seq}, global batch {w.global_batch}, "
        f"{w.precision}",
        f"cluster {cl.name}: {cl.nodes} node(s) x {cl.gpus_per_node} devices, "
        f"{cl.device_memory / GB:.1f} GB, {cl.peak_flops / 1e12:g} TFLOP/s peak, {link}"
        + (f"; calibration {cl.calibrated}" if cl.calibrated else "; preset constants"),
        f"searched {len(result.evaluated):,} layouts in {seconds:.1f} s: {len(result.ranked):,} "
        f"fit, {len(result.evaluated) - len(result.ranked):,} do not",
    ]


def format_result(
    result: PlanResult, top: int, base: list[str], model_name: str, seconds: float
) -> str:
    cl = result.cluster
    lines = [
        *_header(result, model_name, seconds),
        "",
        "  #  layout                             memory/rank      step    tokens/s    MFU  vs best",
    ]
    lines += [_row(i, e, result) for i, e in enumerate(result.ranked[:top], 1)]
    best = result.best
    confirm = distinct_splits(result.ranked, 3)
    tied = sum(result.tied(e) for e in result.ranked)
    lines += [
        "",
        f"{tied} layout(s) tied with the fastest (predicted within the model's "
        f"{MODEL_ERROR:.0%}), simplest first: measure before trusting the order",
        f"run #1: {launch_line(best.candidate, cl, base)}",
        f"confirm the top {len(confirm)} tensor x pipeline splits (20 steps each):",
        *(f"  {line}" for line in confirm_lines(confirm, cl, base)),
        "",
        "the best of each tensor x pipeline (x context) degree:",
    ]
    for (tp, pp, cp), e in sorted(best_per_family(result).items()):
        verdict = "best" if e is best else why_not(result, e)
        family = f"tp {tp} x pp {pp}" + (f" x cp {cp}" if cp > 1 else "")
        lines.append(f"  {family}: {e.candidate.label():<34} {verdict}")
    return "\n".join(lines)


def _entry(e: Evaluated, result: PlanResult) -> dict:
    """One layout's numbers for --json: memory by part, time by part (when it fits), why it
    loses against the best."""
    t = e.time
    return {
        "layout": asdict(e.candidate),
        "overrides": e.candidate.overrides(),
        "memory_bytes": {
            **{
                k: getattr(e.memory, k)
                for k in (
                    "params",
                    "grads",
                    "optimizer",
                    "activations",
                    "buffers",
                    "overhead",
                    "host",
                )
            },
            "total": e.memory.total,
        },
        "fits": e.fits,
        "why": "best" if e is result.best else why_not(result, e),
        **(
            {
                "step_s": t.step,
                "tokens_per_s": t.tokens_per_s(result.work),
                "mfu": t.mfu(result.cluster),
                "parts_s": {
                    "compute": t.compute,
                    "tensor_comm": t.tensor_comm,
                    "bubble": t.bubble,
                    "data_comm": t.data_comm,
                    "optimizer": t.optimizer,
                },
            }
            if t
            else {}
        ),
    }


def result_json(result: PlanResult, top: int, base: list[str], *, every: bool = False) -> dict:
    """The search as JSON; `every`: also every enumerated layout, with its numbers or why it
    does not fit (key "all")."""
    return {
        "workload": {
            "seq": result.work.seq,
            "global_batch": result.work.global_batch,
            "precision": result.work.precision,
            "model": asdict(result.work.model),
        },
        "cluster": {
            "name": result.cluster.name,
            "nodes": result.cluster.nodes,
            "gpus_per_node": result.cluster.gpus_per_node,
            "device_memory_bytes": result.cluster.device_memory,
            "calibration": result.cluster.calibrated,
        },
        "searched": len(result.evaluated),
        "fit": len(result.ranked),
        "top": [_entry(e, result) for e in result.ranked[:top]],
        "tied": sum(result.tied(e) for e in result.ranked),
        "model_error": MODEL_ERROR,
        "launch": launch_line(result.best.candidate, result.cluster, base),
        "confirm": confirm_lines(distinct_splits(result.ranked, 3), result.cluster, base),
        **({"all": [_entry(e, result) for e in result.evaluated]} if every else {}),
    }


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


GRADS_NOTE = " (fp32: tpformer's engine keeps fp32 gradients, also under bf16 compression)"


def format_evaluation(
    result: PlanResult, chosen: Evaluated, place: int | None, keys: list[str], base: list[str],
    model_name: str, seconds: float,
) -> str:  # fmt: skip
    m, t, cl = chosen.memory, chosen.time, result.cluster
    parts = ("params", "grads", "optimizer", "activations", "buffers", "overhead")
    lines = [
        *_header(result, model_name, seconds),
        "",
        f"evaluated ({', '.join(keys) if keys else 'plan.evaluate=true'}): "
        f"{chosen.candidate.label()}",
        "  memory per rank (GB): "
        + ", ".join(
            f"{k} {getattr(m, k) / GB:.2f}" + (GRADS_NOTE if k == "grads" else "") for k in parts
        )
        + f"; total {m.total / GB:.2f} GB of {cl.device_memory / GB:.1f} GB"
        + (f" (+ {m.host / GB:.2f} GB on the host)" if m.host else "")
        + (" -> fits" if chosen.fits else " -> " + why_not(result, chosen)),
    ]
    if t is not None:
        lines.append(
            f"  step {t.step:.4g} s (compute {t.compute:.3g}, "
            f"{'TP+CP' if chosen.candidate.cp > 1 else 'TP'} {t.tensor_comm:.3g}, bubble "
            f"{t.bubble:.3g}, DP {t.data_comm:.3g}, optimizer {t.optimizer:.3g}); "
            f"{t.tokens_per_s(result.work):,.0f} tokens/s, MFU {t.mfu(cl):.1%}"
        )
        where = (
            f"#{place} of {len(result.ranked):,} that fit"
            if place is not None
            else f"not among the {len(result.ranked):,} searched (micro-batch above "
            "plan.max_micro_batch?)"
        )
        verdict = "the best" if place == 1 else why_not(result, chosen)
        lines.append(f"  rank: {where}; {verdict}")
    best = result.best
    lines += [
        f"  the best: {best.candidate.label()} ({best.time.step:.4g} s)",  # type: ignore[union-attr]
        f"run it: {launch_line(chosen.candidate, cl, base)}",
        f"run the best: {launch_line(best.candidate, cl, base)}",
    ]
    return "\n".join(lines)


def plan(
    config: PlanConfig,
    overrides: list[str],
    *,
    as_json: bool,
    do_calibrate: bool,
    every: bool = False,
) -> str:
    precision = str(config.parallel.precision)
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
    if do_calibrate:
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
    if keys or config.plan.evaluate:
        chosen, place = evaluate_given(config, result, device_type=device_type)
        if as_json:
            data = result_json(result, config.plan.top, base, every=every)
            data["evaluated"] = {**_entry(chosen, result), "rank": place}
            return json.dumps(data, indent=1)
        return format_evaluation(result, chosen, place, keys, base, model_name, seconds)
    if as_json:
        return json.dumps(result_json(result, config.plan.top, base, every=every), indent=1)
    return format_result(result, config.plan.top, base, model_name, seconds)


@console_script
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="tpformer-plan", description=__doc__.split("\n")[0])
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
