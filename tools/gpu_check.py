"""GPU acceptance run: throughput, MFU and peak memory of BERT pretraining steps on one device,
next to Hugging Face measured in the same run, and a bf16/fp16 loss check against fp32.

    PYTHONPATH=. python tools/gpu_check.py                 # one GPU: bert_base/large, seq 128/512
    PYTHONPATH=. python tools/gpu_check.py --device cpu --tiny   # the same code on a tiny model

Needs only torch and transformers (no Hydra, no datasets): batches are synthetic token ids made
on the device before the timed steps. tpformer runs in one process (TP=1) with
parallel.rng=fast, bf16 compute with fp32 master weights and fused AdamW, eager and
torch.compile'd, with no, selective and full recomputation; Hugging Face `BertForPreTraining`
runs with attn_implementation="sdpa", bf16 autocast and fused AdamW. Model FLOPs (the same
count credited to both, tpformer.models.costs.step_flops: the work the task needs, the MLM head
on the labeled rows) over the measured step time give TFLOP/s; MFU divides by the device's
datasheet peak (bf16 dense;
--peak-tflops for other devices). Peak memory is torch.cuda.max_memory_allocated per contender.
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial

import torch

from tpformer.config.presets import preset
from tpformer.config.schema import ModelConfig, OptimConfig, ParallelConfig, Precision, Recompute
from tpformer.engine.parallelize import parallelize
from tpformer.interop.hf_keys import hf_config_from_model
from tpformer.layers.sequence import labeled_positions
from tpformer.models import build_model
from tpformer.models.costs import step_flops
from tpformer.parallel.context import ParallelContext
from tpformer.train.metrics import peak_tflops

Batch = dict[str, torch.Tensor]
VOCAB = 30522
VARIANTS = [  # (label, torch.compile, recompute)
    ("tpformer eager", False, "none"),
    ("tpformer compiled", True, "none"),
    ("tpformer compiled + selective", True, "selective"),
    ("tpformer compiled + full", True, "full"),
]
HF_LABEL = "HF BertForPreTraining sdpa"
HF_LABEL = "HF BertForPreTraining sdpa"
TOKENS_PER_STEP = 32768
"""Tokens per step on a GPU: micro-batch 256 at seq 128, 64 at seq 512."""


@dataclass
class Row:
    model: str
    seq: int
    batch: int
    contender: str
    step_s: float
    tokens_per_s: float
    tflops: float
    mfu: float
    peak_gb: float


def synthetic_batches(config: ModelConfig, batch: int, seq: int, n: int, device: torch.device):
    """n MLM+NSP batches on the device: 15% of the tokens labeled, the last quarter of each
    sample's second segment padded away for one sample in four."""
    g = torch.Generator(device="cpu").manual_seed(0)
    out = []
    for _ in range(n):
        ids = torch.randint(5, config.vocab_size, (batch, seq), generator=g)
        types = torch.zeros(batch, seq, dtype=torch.long)
        types[:, seq // 2 :] = 1
        mask = torch.ones(batch, seq, dtype=torch.long)
        mask[::4, seq - seq // 4 :] = 0
        labels = torch.where(torch.rand(batch, seq, generator=g) < 0.15, ids, -100)
        labels[mask == 0] = -100
        nsp = torch.randint(0, 2, (batch,), generator=g)
        parts = {
            "input_ids": ids,
            "token_type_ids": types,
            "attention_mask": mask,
            "mlm_labels": labels,
            "nsp_labels": nsp,
            "mlm_positions": labeled_positions(labels),  # made on the host, as the loader does
        }
        out.append({k: v.to(device, non_blocking=True) for k, v in parts.items()})
    return out


def tpformer_step(
    config: ModelConfig,
    device: torch.device,
    precision: str,
    *,
    compiled: bool,
    recompute: str,
    lr: float = 1e-4,
    rng: str = "fast",
) -> Callable[[int, Batch], torch.Tensor]:
    """One training step of tpformer at TP=1: forward, backward, queued update."""
    ctx = ParallelContext.single(seed=1234, device=device, rng=rng)
    model = build_model(config, ctx, task="pretraining").train()
    parallel = ParallelConfig(precision=Precision(precision), recompute=Recompute(recompute))
    wrapped = parallelize(
        model, parallel, OptimConfig(lr=lr, warmup_steps=0), ctx, compile_blocks=compiled
    )

    def step(i: int, batch: Batch) -> torch.Tensor:
        ctx.rng.set_position(i, 0)
        loss = model(**batch).loss
        wrapped.engine.backward(loss)
        wrapped.engine.queue_step()
        return loss.detach()

    return step


def hf_step(
    config: ModelConfig, device: torch.device, dtype: torch.dtype | None, lr: float = 1e-4
) -> Callable[[int, Batch], torch.Tensor]:
    """Hugging Face BertForPreTraining as its users train it: SDPA attention, autocast to
    `dtype` (None: fp32), fused AdamW on a GPU."""
    from transformers import BertForPreTraining

    hf_config = hf_config_from_model(config, "BertForPreTraining")
    hf_config._attn_implementation = "sdpa"
    torch.manual_seed(1234)
    model = BertForPreTraining(hf_config).to(device).train()
    fused = device.type == "cuda"
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, fused=fused)
    scaler = torch.amp.GradScaler(device.type, enabled=dtype == torch.float16)

    def step(i: int, batch: Batch) -> torch.Tensor:
        with torch.autocast(device.type, dtype=dtype or torch.float32, enabled=dtype is not None):
            loss = model(
                input_ids=batch["input_ids"],
                token_type_ids=batch["token_type_ids"],
                attention_mask=batch["attention_mask"],
                labels=batch["mlm_labels"],
                next_sentence_label=batch["nsp_labels"],
            ).loss
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        return loss.detach()

    return step


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure(
    step: Callable[[int, Batch], torch.Tensor],
    batches: list[Batch],
    device: torch.device,
    warmup: int,
) -> tuple[float, float]:
    """(seconds per step over the batches after `warmup` steps, peak memory in GB)."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    for i in range(warmup):
        step(i, batches[i % len(batches)])
    _sync(device)
    start = time.perf_counter()
    for i, batch in enumerate(batches):
        step(warmup + i, batch)
    _sync(device)
    seconds = (time.perf_counter() - start) / len(batches)
    peak = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else math.nan
    return seconds, peak


def throughput_rows(args: argparse.Namespace, device: torch.device) -> list[Row]:
    rows = []
    # --peak-tflops, else the datasheet bf16 peak of a known GPU (0 elsewhere: MFU not shown)
    peak = peak_tflops(args.peak_tflops, "bf16") if device.type == "cuda" else args.peak_tflops
    for name in args.models:
        for seq in args.seqs:
            config = model_config(name, seq, args.tiny)
            batch = max(1, args.tokens // seq)
            batches = synthetic_batches(config, batch, seq, args.steps, device)
            labeled = sum(int((b["mlm_labels"] != -100).sum()) for b in batches) / len(batches)
            flops = step_flops(config, samples=batch, seq=seq, head_tokens=labeled)
            contenders: list[tuple[str, Callable[[], Callable[[int, Batch], torch.Tensor]]]] = [
                (label, partial(tpformer_step, config, device, "bf16", compiled=c, recompute=r))
                for label, c, r in VARIANTS
                if args.compile or not c
            ]
            contenders.append((HF_LABEL, partial(hf_step, config, device, torch.bfloat16)))
            for label, make in contenders:
                step = make()
                seconds, peak_gb = measure(step, batches, device, args.warmup)
                tflops = flops / seconds / 1e12
                rows.append(
                    Row(
                        name,
                        seq,
                        batch,
                        label,
                        seconds,
                        batch * seq / seconds,
                        tflops,
                        tflops / peak if peak else math.nan,
                        peak_gb,
                    )
                )
                del step
                if device.type == "cuda":
                    torch.cuda.empty_cache()
    return rows


def loss_check(args: argparse.Namespace, device: torch.device) -> list[tuple[str, float, float]]:
    """(precision, largest relative loss difference to fp32, final loss) over args.loss_steps
    steps of tpformer on the same batches; fp16 (with its loss scaler) on a GPU only."""
    config = model_config("bert_tiny" if args.tiny else "bert_small", 128, args.tiny)
    seq = 32 if args.tiny else 128
    batches = synthetic_batches(config, 8 if args.tiny else 32, seq, args.loss_steps, device)
    curves = {}
    precisions = ["fp32", "bf16"] + (["fp16"] if device.type == "cuda" else [])
    for precision in precisions:
        step = tpformer_step(config, device, precision, compiled=False, recompute="none", lr=1e-3)
        curves[precision] = [step(i, b).float() for i, b in enumerate(batches)]
    fp32 = torch.stack(curves["fp32"]).cpu()
    out = []
    for precision in precisions[1:]:
        other = torch.stack(curves[precision]).cpu()
        out.append((precision, float(((other - fp32).abs() / fp32).max()), float(other[-1])))
    out.insert(0, ("fp32", 0.0, float(fp32[-1])))
    return out


def model_config(name: str, seq: int, tiny: bool) -> ModelConfig:
    config = preset(name, vocab_size=512 if tiny else VOCAB)
    return replace(config, max_position_embeddings=max(config.max_position_embeddings, seq))


def main(argv: list[str] | None = None) -> list[Row]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--tiny", action="store_true", help="bert_tiny, seq 32, a few steps")
    parser.add_argument("--models", nargs="+", default=None)
    parser.add_argument("--seqs", nargs="+", type=int, default=None)
    parser.add_argument("--tokens", type=int, default=None, help="tokens per step")
    parser.add_argument("--steps", type=int, default=None, help="timed steps per contender")
    parser.add_argument("--warmup", type=int, default=None)
    parser.add_argument("--loss-steps", type=int, default=None)
    parser.add_argument("--no-compile", dest="compile", action="store_false")
    parser.add_argument("--peak-tflops", type=float, default=0.0)
    args = parser.parse_args(argv)
    tiny = args.tiny
    args.models = args.models or (["bert_tiny"] if tiny else ["bert_base", "bert_large"])
    args.seqs = args.seqs or ([32] if tiny else [128, 512])
    args.tokens = args.tokens or (128 if tiny else TOKENS_PER_STEP)
    args.steps = args.steps or (2 if tiny else 20)
    args.warmup = args.warmup if args.warmup is not None else (1 if tiny else 5)
    args.loss_steps = args.loss_steps or (5 if tiny else 50)
    device = torch.device(args.device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"device: {name}; torch {torch.__version__}")

    rows = throughput_rows(args, device)
    print(
        f"\n{'model':<11}{'seq':>5}{'batch':>6}  {'contender':<32}{'step ms':>9}{'tokens/s':>11}"
        f"{'TFLOP/s':>9}{'MFU':>7}{'peak GB':>9}{'vs HF':>7}"
    )
    for row in rows:
        hf = next(
            r for r in rows if (r.model, r.seq, r.contender) == (row.model, row.seq, HF_LABEL)
        )
        mfu = "-" if math.isnan(row.mfu) else f"{row.mfu:.1%}"
        peak = "-" if math.isnan(row.peak_gb) else f"{row.peak_gb:.2f}"
        print(
            f"{row.model:<11}{row.seq:>5}{row.batch:>6}  {row.contender:<32}"
            f"{row.step_s * 1e3:>9.1f}{row.tokens_per_s:>11.0f}{row.tflops:>9.2f}"
            f"{mfu:>7}{peak:>9}{row.tokens_per_s / hf.tokens_per_s:>7.2f}"
        )
    print(f"\nloss check ({args.loss_steps} steps, same batches, rng fast):")
    for precision, worst, final in loss_check(args, device):
        print(f"  {precision}: final loss {final:.4f}, largest relative gap to fp32 {worst:.2e}")
    return rows


if __name__ == "__main__":
    main()
