"""The planner at scale, next to published results: Narayanan et al. 2021 ("Efficient
Large-Scale Language Model Training on GPU Clusters Using Megatron-LM"), Table 1 (GPT models
of 1.7B to 1T parameters on 32 to 3072 A100-80GB GPUs, 8 per DGX node, fp16, seq 2048,
vocabulary 51,200, activation recomputation), then BERT-large and GPT-2 XL on 8 to 1024 H100s.
The paper's rows are planned with parallel.rng=exact (the attention core materializes its
scores, as the paper's kernels did); the H100 rows with the default, auto, which is fast on
GPUs (the fused attention kernel).

For each row: the layout tpformer-plan picks on `cluster=a100_node` with that many nodes and
the paper's global batch, its predicted TFLOP/s per GPU, and the prediction for the paper's
own setting (its tensor x pipeline sizes and full recomputation; the best layout the planner
finds with those fixed). TFLOP/s use the paper's FLOP count, 96 B s l h^2 (1 + s / 6h +
V / 16 l h), which includes the recomputed forward: for the planner's pick, which may
recompute less, it is the paper's accounting rather than the FLOPs executed.

    python tools/plan_scaling.py            # about a minute
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace

from tpformer.config.presets import preset
from tpformer.config.schema import ModelConfig
from tpformer.planner.candidate import Workload
from tpformer.planner.cluster import load_preset, resolve_cluster
from tpformer.planner.search import Evaluated, search

MEGATRON_TABLE_1 = [
    # params (B), heads, hidden, layers, TP, PP, GPUs, global batch, TFLOP/s per GPU
    (1.7, 24, 2304, 24, 1, 1, 32, 512, 137),
    (3.6, 32, 3072, 30, 2, 1, 64, 512, 138),
    (7.5, 32, 4096, 36, 4, 1, 128, 512, 142),
    (18.4, 48, 6144, 40, 8, 1, 256, 1024, 135),
    (39.1, 64, 8192, 48, 8, 2, 512, 1536, 138),
    (76.1, 80, 10240, 60, 8, 4, 1024, 1792, 140),
    (145.6, 96, 12288, 80, 8, 8, 1536, 2304, 148),
    (310.1, 128, 16384, 96, 8, 16, 1920, 2160, 155),
    (529.6, 128, 20480, 105, 8, 35, 2520, 2520, 163),
    (1008.0, 160, 25600, 128, 8, 64, 3072, 3072, 163),
]
SEQ, VOCAB = 2048, 51200


def paper_flops(work: Workload) -> float:
    """Model FLOPs per step by the paper's formula (with the recomputed forward)."""
    m, s = work.model, work.seq
    h, n_layers = m.hidden_size, m.num_layers
    return (
        96
        * work.global_batch
        * s
        * n_layers
        * h
        * h
        * (1 + s / (6 * h) + m.vocab_size / (16 * n_layers * h))
    )


def tflops(work: Workload, e: Evaluated, gpus: int) -> float:
    return paper_flops(work) / e.time.step / gpus / 1e12  # type: ignore[union-attr]


def gpt(layers: int, hidden: int, heads: int) -> ModelConfig:
    return ModelConfig(
        arch="gpt",
        vocab_size=VOCAB,
        hidden_size=hidden,
        num_layers=layers,
        num_heads=heads,
        intermediate_size=4 * hidden,
        max_position_embeddings=SEQ,
        type_vocab_size=0,
        activation="gelu_tanh",
        pad_vocab_to=128,
    )


def cluster(name: str, gpus: int):
    preset_config = load_preset(name)
    nodes = max(1, gpus // preset_config.gpus_per_node)
    return resolve_cluster(
        replace(preset_config, nodes=nodes, calibration="none"), "bf16", cache_dir="/nonexistent"
    )


def describe(e: Evaluated) -> str:
    c = e.candidate
    extra = [c.schedule] if c.pp > 1 else []
    extra += ["SP"] if c.sequence_parallel else []
    extra += [c.recompute] if c.recompute != "none" else []
    extra += [f"offload {c.cpu_offload}"] if c.cpu_offload != "none" else []
    return f"{c.tp} x {c.pp} x {c.dp}, ZeRO-{c.zero_stage}, micro {c.micro_batch}" + (
        f" ({', '.join(extra)})" if extra else ""
    )


def megatron_rows() -> None:
    print(
        "| params | GPUs | batch | published TP x PP | published TFLOP/s | planner's pick "
        "(TP x PP x DP) | predicted TFLOP/s | predicted at the published TP x PP, full recompute |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for params, heads, hidden, layers, tp, pp, gpus, batch, published in MEGATRON_TABLE_1:
        # rng exact: the attention core keeps its [b, h, s, s] scores, as Megatron's 2021 kernels
        # did (no flash attention)
        work = Workload(gpt(layers, hidden, heads), SEQ, batch, "bf16", 1.0, nsp=False, rng="exact")
        start = time.perf_counter()
        result = search(work, cluster("a100_node", gpus), max_micro_batch=16)
        same = [
            e
            for e in result.ranked
            if (e.candidate.tp, e.candidate.pp) == (tp, pp) and e.candidate.recompute == "full"
        ]
        at_published = f"{tflops(work, same[0], gpus):.0f}" if same else "does not fit"
        print(
            f"| {params:g}B | {gpus} | {batch} | {tp} x {pp} | {published} | "
            f"{describe(result.best)} | {tflops(work, result.best, gpus):.0f} | {at_published} |"
            f"  <!-- {len(result.evaluated)} layouts, {time.perf_counter() - start:.1f} s -->"
        )


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
            cl = cluster("h100_node", gpus)
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
    megatron_rows()
    h100_rows()


if __name__ == "__main__":
    main()
