"""How tpformer-plan prints a plan: the ranked table with each layout's launch line, the
confirmation runs, the JSON for tools, and the evaluation of a given layout."""

from __future__ import annotations

from dataclasses import asdict, replace
from typing import TYPE_CHECKING

from tpformer.planner.candidate import Candidate, Workload
from tpformer.planner.cluster import Cluster
from tpformer.planner.memory import predict_stage_memory, stage_params
from tpformer.planner.search import (
    GB,
    MODEL_ERROR,
    Evaluated,
    PlanResult,
    best_per_family,
    distinct_splits,
    why_not,
)
from tpformer.planner.traffic import priced, rank_flops, step_traffic

if TYPE_CHECKING:
    from tpformer.train.dry_run import DryRun


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
        f"rule: the fastest sets the bar; within {MODEL_ERROR:.0%} of it the simplest wins "
        "(lower ZeRO stage, no offload, less recomputation, fewer pipeline stages, then time)",
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


def entry_json(e: Evaluated, result: PlanResult) -> dict:
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
        "top": [entry_json(e, result) for e in result.ranked[:top]],
        "tied": sum(result.tied(e) for e in result.ranked),
        "model_error": MODEL_ERROR,
        "launch": launch_line(result.best.candidate, result.cluster, base),
        "confirm": confirm_lines(distinct_splits(result.ranked, 3), result.cluster, base),
        **({"all": [entry_json(e, result) for e in result.evaluated]} if every else {}),
    }


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


STEPS_NOTE = "fake backend, meta device, the second of two steps"


def dry_run_lines(result: PlanResult, chosen: Evaluated, runs: list[DryRun]) -> list[str]:
    """Per dry-run rank: what the real step held, computed and sent, next to the planner's
    prediction for the rank's stage."""
    c = chosen.candidate
    title = f"{c.label()} on {result.cluster.world_size} ranks"
    return ["", *planned_lines(title, result.work, c, result.cluster, runs)]


def planned_lines(
    title: str, work: Workload, c: Candidate, cluster: Cluster, runs: list[DryRun]
) -> list[str]:
    """Per dry-run rank of layout `c`, its rows beside the planner's for the rank's stage."""
    lines = [f"dry run ({STEPS_NOTE}) of {title}:"]
    for run in runs:
        # offloaded state stands on meta too: the planner's split before it goes to the host
        (p,) = predict_stage_memory(work, replace(c, cpu_offload="none"), cluster, [run.stage])
        planned = {
            "params": p.params,
            "grads": p.grads,
            "optimizer": p.optimizer,
            "activations": p.activations,
            "buffers": p.buffers,
            "step peak*": p.activations + p.buffers,
        }
        flops = rank_flops(work, c, run.stage)
        lines += _rank_lines(run, planned, flops, step_traffic(work, c, run.stage))
        lines.append(
            "    * the peak of activations, buffers and the step's temporaries; the planner "
            f"covers temporaries by its overhead ({cluster.overhead / 1e9:g} GB)"
        )
    return lines


def _rank_lines(
    run: DryRun,
    planned: dict[str, float] | None = None,
    flops: float | None = None,
    traffic: dict[str, float] | None = None,
) -> list[str]:
    """One dry-run rank's rows, each with the planner's number when there is one."""

    def beside(value: float, width: int) -> str:
        return f"  planner {value / 1e6:>{width},.3f} MB"

    measured = {
        "params": run.params,
        "grads": run.grads,
        "optimizer": run.optimizer,
        "activations": run.activations,
        "buffers": run.buffers,
        "step peak*": run.step_peak,
    }
    lines = [f"  rank {run.rank} (stage {run.stage}), {run.seconds:.1f} s:"]
    lines += [
        f"    {name:<17}{value / 1e6:>14,.3f} MB"
        + (beside(planned[name], 14) if planned is not None else "")
        for name, value in measured.items()
    ]
    lines.append(
        f"    FLOPs per step  {run.flops_per_step:>14.4g} (this rank, executed)"
        + (f"  planner {flops:.4g}" if flops is not None else "")
    )
    lines += [
        f"    {name:<28} {calls:>5} calls {sent / 1e6:>14,.3f} MB sent"
        + (beside(priced(traffic, name), 12) if traffic is not None else "")
        for name, (calls, sent) in run.collectives.items()
    ]
    return lines
