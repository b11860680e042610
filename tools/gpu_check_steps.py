"""The steps gpu_check.py times, each run in a process of its own: a tpformer or Hugging Face
BERT pretraining step on synthetic batches made on the device before timing, and the precision
check's loss curves."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch

from tpformer.config.presets import preset
from tpformer.config.schema import ModelConfig, OptimConfig, ParallelConfig, Precision, Recompute
from tpformer.data.pretraining import document_positions
from tpformer.device_peaks import peak_tflops
from tpformer.engine.parallelize import parallelize
from tpformer.interop.families import hf_config_from_model
from tpformer.layers.sequence import document_mask, labeled_positions
from tpformer.models import build_model
from tpformer.models.costs import step_flops
from tpformer.parallel.context import ParallelContext

Batch = dict[str, torch.Tensor]
VOCAB = 30522


def model_config(name: str, seq: int, tiny: bool, dropout: float | None = None) -> ModelConfig:
    config = preset(name, vocab_size=512 if tiny else VOCAB)
    config = replace(config, max_position_embeddings=max(config.max_position_embeddings, seq))
    if dropout is not None:
        config = replace(config, dropout=dropout, attention_dropout=dropout)
    return config


BATCH_KINDS = ("padded", "unpadded", "packed")
"""padded: the last 40% of the sequence (most of its second segment) padded away for one sample
in four (pad fraction ~0.1, 0.0996 at seq 128 and 512), an attention mask on both sides;
unpadded: every token real, no mask passed (tpformer's loader drops an all-ones mask on the
host, data/steps.py; Hugging Face is given none), so each side may take its unmasked kernel;
packed: every token real, four documents a sequence (data.pack): tpformer gets their
position_ids, Hugging Face the same document mask as a [b, 1, s, s] attention mask and the same
positions (timed only when asked: --batch-kinds packed)."""
DEFAULT_KINDS = ("padded", "unpadded")
DOCUMENTS = 4
"""Documents per packed sequence, cut at random places."""


def synthetic_batches(
    config: ModelConfig, batch: int, seq: int, n: int, device: torch.device, kind: str = "padded"
) -> list[Batch]:
    """n MLM+NSP batches of `kind` (BATCH_KINDS) on the device, 15% of the real tokens
    labeled."""
    if kind not in BATCH_KINDS:
        raise ValueError(f"batch kind {kind!r}: one of {', '.join(BATCH_KINDS)}")
    g = torch.Generator(device="cpu").manual_seed(0)
    out = []
    for _ in range(n):
        ids = torch.randint(5, config.vocab_size, (batch, seq), generator=g)
        types = torch.zeros(batch, seq, dtype=torch.long)
        types[:, seq // 2 :] = 1
        mask = torch.ones(batch, seq, dtype=torch.long)
        if kind == "padded":
            mask[::4, seq - 2 * seq // 5 :] = 0
        labels = torch.where(torch.rand(batch, seq, generator=g) < 0.15, ids, -100)
        labels[mask == 0] = -100
        nsp = torch.randint(0, 2, (batch,), generator=g)
        parts = {
            "input_ids": ids,
            "token_type_ids": types,
            "mlm_labels": labels,
            "nsp_labels": nsp,
            "mlm_positions": labeled_positions(labels),  # made on the host, as the loader does
        }
        if kind == "padded":
            parts["attention_mask"] = mask
        if kind == "packed":
            parts["position_ids"] = packed_positions(batch, seq, g)
        out.append({k: v.to(device, non_blocking=True) for k, v in parts.items()})
    return out


def packed_positions(batch: int, seq: int, g: torch.Generator) -> torch.Tensor:
    """[batch, seq] positions restarting at DOCUMENTS - 1 random cuts a row (data.pack's)."""
    rows = []
    for _ in range(batch):
        cuts = torch.randperm(seq - 1, generator=g)[: DOCUMENTS - 1].sort().values + 1
        rows.append(document_positions([0, *cuts.tolist()], seq))
    return torch.stack(rows)


def hf_attention_mask(batch: Batch) -> torch.Tensor | None:
    """What Hugging Face BERT is given as its attention mask: the padding mask, or for a
    packed batch the documents' bool [b, 1, s, s] mask (transformers passes a 4-D mask to
    SDPA as it is: True = attend)."""
    if "position_ids" in batch:
        return document_mask(batch["position_ids"], None, causal=False)
    return batch.get("attention_mask")


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
    config: ModelConfig,
    device: torch.device,
    dtype: torch.dtype | None,
    lr: float = 1e-4,
    compiled: bool = False,
) -> Callable[[int, Batch], torch.Tensor]:
    """Hugging Face BertForPreTraining as its users train it: SDPA attention, autocast to
    `dtype` (None: fp32), fused AdamW on a GPU; `compiled` as Trainer's `torch_compile=True`
    (`torch.compile(model)`)."""
    from transformers import BertForPreTraining

    hf_config = hf_config_from_model(config, "BertForPreTraining")
    hf_config._attn_implementation = "sdpa"
    torch.manual_seed(1234)
    model = BertForPreTraining(hf_config).to(device).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, fused=device.type == "cuda")
    forward = torch.compile(model) if compiled else model

    def step(i: int, batch: Batch) -> torch.Tensor:
        with torch.autocast(device.type, dtype=dtype or torch.float32, enabled=dtype is not None):
            loss = forward(
                input_ids=batch["input_ids"],
                token_type_ids=batch["token_type_ids"],
                attention_mask=hf_attention_mask(batch),
                position_ids=batch.get("position_ids"),
                labels=batch["mlm_labels"],
                next_sentence_label=batch["nsp_labels"],
            ).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.detach()

    return step


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure_contender(spec: Any) -> dict[str, Any]:
    """Time one contender (a gpu_check.Contender) in this process: its row as a dict."""
    device = torch.device(spec.device)
    config = model_config(spec.model, spec.seq, spec.tiny)
    batches = synthetic_batches(config, spec.batch, spec.seq, spec.steps, device, spec.kind)
    if spec.hf:
        step = hf_step(config, device, torch.bfloat16, compiled=spec.compiled)
    else:
        step = tpformer_step(
            config, device, spec.precision, compiled=spec.compiled, recompute=spec.recompute
        )
    for i in range(spec.warmup):
        step(i, batches[i % len(batches)])
    synchronize(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    start = time.perf_counter()
    for i, batch in enumerate(batches):
        step(spec.warmup + i, batch)
    synchronize(device)
    seconds = (time.perf_counter() - start) / len(batches)
    labeled = sum(int((b["mlm_labels"] != -100).sum()) for b in batches) / len(batches)
    flops = step_flops(config, samples=spec.batch, seq=spec.seq, head_tokens=labeled)
    peak = spec.peak_tflops
    if not peak and device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        peak = peak_tflops(props.name, props.multi_processor_count, "bf16")
    tflops = flops / seconds / 1e12
    return {
        **vars(spec),
        "step_s": seconds,
        "tokens_per_s": spec.batch * spec.seq / seconds,
        "flops_per_step": flops,
        "labeled_tokens": labeled,
        "tflops": tflops,
        "mfu": tflops / peak if peak else math.nan,
        "peak_gib": torch.cuda.max_memory_allocated(device) / 2**30
        if device.type == "cuda"
        else math.nan,
    }


def precision_gaps(device: str, tiny: bool, steps: int, fp8: bool) -> dict[str, float]:
    """{precision: largest relative loss gap to fp32} over `steps` steps of tpformer on the
    same batches with dropout 0 (no mask difference between kernels); fp16 on a GPU only, fp8
    where it runs (`fp8`)."""
    dev = torch.device(device)
    seq = 32 if tiny else 128
    config = model_config("bert_tiny" if tiny else "bert_small", seq, tiny, dropout=0.0)
    batches = synthetic_batches(config, 8 if tiny else 32, seq, steps, dev)
    precisions = ["fp32", "bf16"] + (["fp16"] if dev.type == "cuda" else [])
    precisions += ["fp8"] if fp8 else []
    curves = {}
    for precision in precisions:
        step = tpformer_step(config, dev, precision, compiled=False, recompute="none", lr=1e-3)
        curves[precision] = torch.stack([step(i, b).float() for i, b in enumerate(batches)])
    fp32 = curves["fp32"].cpu()
    return {p: float(((curves[p].cpu() - fp32).abs() / fp32).max()) for p in precisions[1:]}
