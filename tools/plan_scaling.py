"""The planner at scale, next to published results (tools/published_runs.py):
Narayanan et al. 2021, Table 1 (GPT 1.7B-1T on 32-3,072 A100s) and Table 2 (ZeRO-3 without
model parallelism vs PTD-P for the 175B and 530B models), Korthikanti et al. 2022, Table 4 (one
22B layer under five options) and Table 5 (22B-1T iteration times with full recomputation and
with SP + selective recomputation), each priced with the options those runs had; then
BERT-large and GPT-2 XL on 8 to 1024 H100s with tpformer's own options.

Table 1: for each row, the published layout priced (its tensor x pipeline split, the best
micro-batch the planner finds for it) and the ratio of predicted to published TFLOP/s; the
planner's first choice among the layouts Megatron-LM 2021 could run (no ZeRO, no SP, full
recomputation, DP all-reduce after backward) and how much slower it predicts the published
split; and what it picks with all of tpformer's options. Table 2: every row at its published
layout and micro-batch. TFLOP/s use the paper's FLOP count (with the recomputed forward).

    python tools/plan_scaling.py            # about 15 seconds
"""

from __future__ import annotations

import argparse
import math
import time
from dataclasses import replace

from published_runs import (
    KORTHIKANTI_TABLE_4,
    KORTHIKANTI_TABLE_5,
    MEGATRON_TABLE_1,
    MEGATRON_TABLE_2,
    TABLE_4_RUN,
    ZERO_TABLE_1,
    cluster,
    megatron_matmul_efficiency,
    reproduce,
    table_4_layer,
    tflops,
)

from tpformer.config.presets import preset
from tpformer.engine.memory import zero_memory_bytes
from tpformer.planner.candidate import Workload
from tpformer.planner.cluster import load_preset, resolve_cluster
from tpformer.planner.search import Evaluated, search
from tpformer.planner.step_time import model_flops

GB = 1e9


def describe(e: Evaluated) -> str:
    c = e.candidate
    extra = [c.schedule] if c.pp > 1 else []
    extra += ["SP"] if c.sequence_parallel else []
    extra += [c.recompute] if c.recompute != "none" else []
    extra += [f"offload {c.cpu_offload}"] if c.cpu_offload != "none" else []
    return f"{c.tp} x {c.pp} x {c.dp}, ZeRO-{c.zero_stage}, micro {c.micro_batch}" + (
        f" ({', '.join(extra)})" if extra else ""
    )


def fit_text(e: Evaluated) -> str:
    return f"{e.memory.total / GB:.1f} GB" + ("" if e.fits else " (does not fit)")


def megatron_rows() -> list[float]:
    """Table 1; returns the throughput ratios."""
    print(
        "| params | GPUs | batch | published TP x PP | published TFLOP/s | predicted at it "
        "| ratio | memory | first choice (2021 options) | published split slower by | "
        "tpformer's pick (all options) | its TFLOP/s |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    ratios = []
    for run in MEGATRON_TABLE_1:
        start = time.perf_counter()
        r = reproduce(run)
        own = search(r.work, cluster(run), max_micro_batch=16).best
        ratios.append(r.ratio)
        first = "the published split" if r.first_is_published else describe(r.first)
        print(
            f"| {run.params_b:g}B | {run.gpus} | {run.global_batch} | {run.tp} x {run.pp} | "
            f"{run.tflops:g} | {tflops(r.work, r.published, run.gpus):.0f} "
            f"({describe(r.published)}) | {r.ratio:.2f} | {fit_text(r.published)} | {first} | "
            f"{r.margin:+.1%} | {describe(own)} | {tflops(r.work, own, run.gpus):.0f} |"
            f"  <!-- {time.perf_counter() - start:.1f} s -->"
        )
    return ratios


def zero3_rows() -> list[float]:
    """Table 2; returns the throughput ratios of the rows that fit."""
    print(
        "\n| scheme | params | GPUs | batch | layout (TP x PP x DP, micro) | published TFLOP/s | "
        "predicted | ratio | memory |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    ratios = []
    for run in MEGATRON_TABLE_2:
        r = reproduce(run)
        e = r.published
        predicted = f"{tflops(r.work, e, run.gpus):.0f}" if e.fits else "-"
        if e.fits:
            ratios.append(r.ratio)
        print(
            f"| {run.scheme} | {run.params_b:g}B | {run.gpus} | {run.global_batch} | "
            f"{run.tp} x {run.pp} x {run.dp}, {e.candidate.micro_batch} | {run.tflops:g} | "
            f"{predicted} | {r.ratio:.2f} | {fit_text(e)} |"
        )
    return ratios


def korthikanti_layer_rows() -> None:
    """Table 4: the fitted row and the four predicted ones."""
    efficiency = megatron_matmul_efficiency()
    print(
        f"\nGEMM plateau of the 2021-22 stack, fitted to Table 4's baseline: {efficiency:.3f} of "
        f"peak ({efficiency * 312:.0f} TFLOP/s; today's measured plateau 0.869)\n"
    )
    print("| 22B layer, TP=8, micro 4 | measured fwd + bwd (ms) | predicted (ms) | ratio |")
    print("|---|---|---|---|")
    cl = cluster(TABLE_4_RUN)
    for i, timing in enumerate(KORTHIKANTI_TABLE_4):
        predicted = table_4_layer(timing, cl) * 1e3
        note = " (fitted)" if i == 0 else ""
        print(
            f"| {timing.name}{note} | {timing.forward_ms} + {timing.backward_ms} = "
            f"{timing.ms:.1f} | {predicted:.2f} | {predicted / timing.ms:.3f} |"
        )


def korthikanti_rows() -> list[float]:
    """Table 5 at Table 3's layouts; returns the throughput ratios."""
    print(
        "\n| params | GPUs | TP x PP, micro, schedule | options | published s | predicted s | "
        "ratio | MFU published / predicted | memory | first choice (same options) | "
        "published split slower by |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    ratios = []
    for run in KORTHIKANTI_TABLE_5:
        r = reproduce(run)
        e, peak = r.published, 312e12 * run.gpus
        assert e.time is not None
        ratios.append(r.ratio)
        first = "the published split" if r.first_is_published else describe(r.first)
        options = "SP + selective" if run.scheme == "sp-selective" else "full recomputation"
        schedule = "interleaved x3" if run.virtual_stages == 3 else run.schedule
        print(
            f"| {run.params_b:g}B | {run.gpus} | {run.tp} x {run.pp}, {run.micro_batch}, "
            f"{schedule} | {options} | {run.seconds:g} | {e.time.step:.2f} | {r.ratio:.2f} | "
            f"{model_flops(r.work) / run.seconds / peak:.1%} / "
            f"{model_flops(r.work) / e.time.step / peak:.1%} | {fit_text(e)} | {first} | "
            f"{r.margin:+.1%} |"
        )
    return ratios


def _gb(x: float) -> str:
    return f"{x:,.0f}" if x >= 100 else f"{x:.3g}"


def zero_memory_rows() -> list[float]:
    """The ZeRO paper's Table 1 next to the planner's model-state bytes, under the paper's
    16-bit gradients (DeepSpeed's profile) and under tpformer's engine (fp32 gradients)."""
    print(
        "\n| params | DP | stage | ZeRO paper GB | planner, 16-bit grads GB | ratio | "
        "tpformer's engine (fp32 grads) GB | ratio |"
    )
    print("|---|---|---|---|---|---|---|---|")
    ratios = []
    for params, rows in ZERO_TABLE_1.items():
        for dp, per_stage in rows.items():
            for stage, paper in enumerate(per_stage, start=1):
                sizes = [
                    zero_memory_bytes(
                        stage, int(params), dp, param_bytes=2, mixed=True, grad_bytes=g
                    ).total
                    / GB
                    for g in (2, 4)
                ]
                ratios.append(sizes[0] / paper)
                print(
                    f"| {params / 1e9:g}B | {dp} | {stage} | {paper:g} | {_gb(sizes[0])} | "
                    f"{sizes[0] / paper:.3f} | {_gb(sizes[1])} | {sizes[1] / paper:.2f} |"
                )
    return ratios


def h100_rows() -> None:
    print(
        "\n| model | H100s | seq | global batch | planner's pick (TP x PP x DP) | step s | "
        "tokens/s | MFU |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for name, seq, per_gpu in (("bert_large", 512, 32), ("gpt2_xl", 1024, 8)):
        model = preset(name)
        for gpus in (8, 64, 256, 1024):
            work = Workload(
                model,
                seq,
                per_gpu * gpus,
                "bf16",
                0.15 if model.arch == "bert" else 1.0,
                nsp=model.arch == "bert",
            )
            base = load_preset("h100_node")
            cl = resolve_cluster(
                replace(base, nodes=gpus // base.gpus_per_node, calibration="none"),
                "bf16",
                cache_dir="/nonexistent",
            )
            best = search(work, cl, max_micro_batch=32).best
            t = best.time
            assert t is not None
            print(
                f"| {name} | {gpus} | {seq} | {work.global_batch} | {describe(best)} | "
                f"{t.step:.3f} | {t.tokens_per_s(work):,.0f} | {t.mfu(cl):.1%} |"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.parse_args()
    table_1 = megatron_rows()
    table_2 = zero3_rows()
    korthikanti_layer_rows()
    table_5 = korthikanti_rows()
    memory = zero_memory_rows()
    print(
        f"\nmodel states / the ZeRO paper's Table 1 over {len(memory)} entries: "
        f"{min(memory):.3f}-{max(memory):.3f}"
    )
    print("\npredicted / published throughput:")
    for name, ratios in (
        ("Narayanan Table 1", table_1),
        ("Narayanan Table 2 (ZeRO-3, then PTD-P)", table_2),
        ("Korthikanti Table 5", table_5),
    ):
        worst = max(ratios, key=lambda r: abs(math.log(r)))
        print(
            f"  {name}: {len(ratios)} rows, worst {worst:.2f} "
            f"(min {min(ratios):.2f}, max {max(ratios):.2f})"
        )
    h100_rows()


if __name__ == "__main__":
    main()
