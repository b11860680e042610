"""Step time of tpformer BERT against transformers' BertForMaskedLM, interleaved in one run.

    python tools/benchmark_model.py                    # bert-small-4L, 10 rounds
    python tools/benchmark_model.py --rounds 20 --tp 1 2

Each round runs one forward+backward+AdamW step of every contender in turn (HF, tpformer TP=1
in this process with 2 threads, tpformer TP=2 as 2 gloo processes x 1 thread), so machine noise
hits all of them alike; the table reports medians, ratios against HF, tokens/s, achieved TFLOP/s
and an MFU estimate against a matmul peak measured in the same run (or --peak-tflops).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import tempfile
import time
from datetime import timedelta

import torch

from tpformer.config.schema import ModelConfig
from tpformer.models import build_model
from tpformer.parallel.context import ParallelContext

VOCAB, SEQ, BATCH, MASK_RATE = 30522, 128, 8, 0.15


def reference_config(dropout: float) -> ModelConfig:
    """The "bert-small-4L" reference: hidden 512, 8 heads, 4 layers, FFN 2048."""
    return ModelConfig(
        arch="bert",
        vocab_size=VOCAB,
        hidden_size=512,
        num_layers=4,
        num_heads=8,
        intermediate_size=2048,
        max_position_embeddings=512,
        dropout=dropout,
        attention_dropout=dropout,
    )


def make_batch(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, VOCAB, (BATCH, SEQ), generator=g)
    labels = torch.full_like(ids, -100)
    masked = torch.rand(BATCH, SEQ, generator=g) < MASK_RATE
    labels[masked] = ids[masked]
    return {"input_ids": ids, "labels": labels, "attention_mask": torch.ones_like(ids)}


def step_flops(config: ModelConfig, *, head_tokens: int) -> float:
    """Executed fwd+bwd FLOPs (3x forward): matmuls of the layers, attention, and the MLM head
    over `head_tokens` positions (all for HF, the masked ones for tpformer)."""
    h, layers, tokens = config.hidden_size, config.num_layers, BATCH * SEQ
    per_token_layer = 2 * (4 * h * h + 2 * h * config.intermediate_size) + 4 * SEQ * h
    head = 2 * (h * h + h * VOCAB)
    return 3 * (tokens * layers * per_token_layer + head_tokens * head)


def matmul_peak_tflops(threads: int) -> float:
    torch.set_num_threads(threads)
    a, b = torch.randn(2048, 2048), torch.randn(2048, 2048)
    for _ in range(3):
        a @ b
    start = time.perf_counter()
    n = 10
    for _ in range(n):
        a @ b
    return 2 * 2048**3 * n / (time.perf_counter() - start) / 1e12


class HFStep:
    def __init__(self, dropout: float) -> None:
        from transformers import BertConfig, BertForMaskedLM

        cfg = BertConfig(
            vocab_size=VOCAB,
            hidden_size=512,
            num_hidden_layers=4,
            num_attention_heads=8,
            intermediate_size=2048,
            hidden_dropout_prob=dropout,
            attention_probs_dropout_prob=dropout,
        )
        torch.manual_seed(0)
        self.model = BertForMaskedLM._from_config(cfg, attn_implementation="sdpa").train()
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-4, fused=True)
        self.batch = make_batch()

    def __call__(self) -> float:
        loss = self.model(**self.batch).loss
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()
        return loss.item()


class TPStep:
    def __init__(self, ctx: ParallelContext, dropout: float) -> None:
        self.ctx = ctx
        self.model = build_model(reference_config(dropout), ctx, task="pretraining").train()
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-4, fused=True)
        batch = make_batch()
        self.batch = {
            "input_ids": batch["input_ids"],
            "attention_mask": batch["attention_mask"],
            "mlm_labels": batch["labels"],
        }
        self.step = 0

    def __call__(self) -> float:
        self.ctx.rng.set_position(self.step)
        self.step += 1
        loss = self.model(**self.batch).loss
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()
        return loss.item()


def _tp_worker(rank: int, world: int, store: str, dropout: float, commands, replies) -> None:
    torch.set_num_threads(1)
    torch.distributed.init_process_group(
        "gloo",
        init_method=f"file://{store}",
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=300),
    )
    ctx = ParallelContext.create(tensor=world, device=torch.device("cpu"))
    step = TPStep(ctx, dropout)
    while commands[rank].get() == "step":
        step()
        if rank == 0:
            replies.put("done")
    ctx.destroy()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2, help="threads of the 1-process runs")
    parser.add_argument("--tp", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--dropout", type=float, default=0.1)
    parser.add_argument("--peak-tflops", type=float, default=None)
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    contenders: dict[str, object] = {"HF BertForMaskedLM": HFStep(args.dropout)}
    workers, commands = [], []
    if 1 in args.tp:
        contenders["tpformer TP=1"] = TPStep(ParallelContext.single(device="cpu"), args.dropout)
    for tp in (t for t in args.tp if t > 1):
        mpctx = mp.get_context("spawn")
        store = os.path.join(tempfile.mkdtemp(), "store")
        commands = [mpctx.Queue() for _ in range(tp)]
        replies = mpctx.Queue()
        workers = [
            mpctx.Process(target=_tp_worker, args=(r, tp, store, args.dropout, commands, replies))
            for r in range(tp)
        ]
        for w in workers:
            w.start()

        def remote(commands=commands, replies=replies) -> None:
            for q in commands:
                q.put("step")
            replies.get(timeout=600)

        contenders[f"tpformer TP={tp} ({tp} proc x 1 thread)"] = remote

    times: dict[str, list[float]] = {name: [] for name in contenders}
    for round_ in range(args.warmup + args.rounds):
        for name, step in contenders.items():
            torch.set_num_threads(args.threads)
            start = time.perf_counter()
            step()  # type: ignore[operator]
            if round_ >= args.warmup:
                times[name].append(time.perf_counter() - start)
    for q in commands:
        q.put("stop")
    for w in workers:
        w.join()

    peak = args.peak_tflops or matmul_peak_tflops(args.threads)
    config = reference_config(args.dropout)
    masked = int((make_batch()["labels"] != -100).sum())
    tokens = BATCH * SEQ
    print(
        f"bert-small-4L: hidden 512, 8 heads, 4 layers, FFN 2048, vocab {VOCAB}, seq {SEQ}, "
        f"micro-batch {BATCH}, fp32, dropout {args.dropout}, {masked} masked tokens; "
        f"{args.rounds} interleaved rounds; peak {peak:.3f} TFLOP/s "
        f"({'given' if args.peak_tflops else f'2048^3 matmul, {args.threads} threads'})"
    )
    base = statistics.median(times["HF BertForMaskedLM"])
    print(
        f"{'contender':40s} {'median s':>9s} {'vs HF':>6s} {'tokens/s':>9s} "
        f"{'TFLOP/s':>8s} {'MFU':>6s}"
    )
    for name, ts in times.items():
        med = statistics.median(ts)
        head_tokens = tokens if name.startswith("HF") else masked
        flops = step_flops(config, head_tokens=head_tokens)
        print(
            f"{name:40s} {med:9.4f} {med / base:6.2f} {tokens / med:9.0f} "
            f"{flops / med / 1e12:8.3f} {flops / med / 1e12 / peak:6.1%}"
        )


if __name__ == "__main__":
    main()
