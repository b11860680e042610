"""Step time of tpformer's Llama-style decoder and ModernBERT-style encoder against
transformers' LlamaForCausalLM and ModernBertForMaskedLM, interleaved in one run on the CPU.

    python tools/benchmark_families.py                      # both families, 10 rounds
    python tools/benchmark_families.py --families llama --rounds 5 --seq 512
    python tools/benchmark_families.py --families modernbert --seq 2048 --batch 1 --window 128

Each family's contenders start from the same weights (a save_pretrained directory that
tpformer loads with init's loader), train on the same batches with AdamW, one process and the
same threads (TP=1). Each round runs one forward + backward + AdamW step of every contender in
turn, so machine noise hits all alike; the table reports medians, tokens/s and the ratio to the
Hugging Face model with its defaults. ModernBERT's MLM head runs on every position by default
in transformers (`sparse_prediction=False`); the model's own recipe sets it, so that contender
is timed too. The first step's losses are printed side by side (dropout 0: they agree).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

from tpformer.config.presets import preset
from tpformer.interop.hf import load_hf_model
from tpformer.parallel.context import ParallelContext

Step = Callable[[dict[str, torch.Tensor]], float]


def hf_llama(seq: int) -> torch.nn.Module:
    """LlamaForCausalLM of the llama_tiny preset's shape."""
    import transformers

    c = preset("llama_tiny")
    return transformers.LlamaForCausalLM(
        transformers.LlamaConfig(
            vocab_size=c.vocab_size,
            hidden_size=c.hidden_size,
            intermediate_size=c.intermediate_size,
            num_hidden_layers=c.num_layers,
            num_attention_heads=c.num_heads,
            num_key_value_heads=c.kv_heads,
            max_position_embeddings=max(seq, c.max_position_embeddings),
            attn_implementation="sdpa",
        )
    )


def hf_modernbert(seq: int, sparse: bool = False, window: int = 0) -> torch.nn.Module:
    """ModernBertForMaskedLM of the modernbert_tiny preset's shape (`window`: its local
    layers' window, 0: the preset's)."""
    import transformers

    c = preset("modernbert_tiny")
    rotary, local = c.rotary, c.local_attention
    assert rotary is not None and local is not None  # the preset's
    return transformers.ModernBertForMaskedLM(
        transformers.ModernBertConfig(
            vocab_size=c.vocab_size,
            hidden_size=c.hidden_size,
            intermediate_size=c.intermediate_size,
            num_hidden_layers=c.num_layers,
            num_attention_heads=c.num_heads,
            max_position_embeddings=max(seq, 512),
            local_attention=window or local.window,
            global_rope_theta=rotary.theta,
            local_rope_theta=rotary.local_theta,
            pad_token_id=0,
            bos_token_id=2,
            eos_token_id=3,
            cls_token_id=2,
            sep_token_id=3,
            sparse_prediction=sparse,
            attn_implementation="sdpa",
        )
    )


def batches(family: str, vocab: int, batch: int, seq: int, n: int) -> list[dict]:
    """n batches: causal LM token windows, or MLM inputs with 30% of positions labeled
    (ModernBERT's masking rate)."""
    g = torch.Generator().manual_seed(0)
    out = []
    for _ in range(n):
        ids = torch.randint(5, vocab, (batch, seq), generator=g)
        if family == "llama":
            out.append({"input_ids": ids})
            continue
        labels = torch.full_like(ids, -100)
        chosen = torch.rand(batch, seq, generator=g) < 0.3
        labels[chosen] = ids[chosen]
        out.append({"input_ids": ids, "labels": labels, "attention_mask": torch.ones_like(ids)})
    return out


def _hf_step(model: torch.nn.Module) -> Step:
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    model.train()

    def step(batch: dict[str, torch.Tensor]) -> float:
        labels = batch.get("labels", batch["input_ids"])
        loss = model(**{**batch, "labels": labels}).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return float(loss)

    return step


def _tpformer_step(directory: Path, family: str) -> Step:
    model = load_hf_model(directory, ParallelContext.single(device="cpu")).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step(batch: dict[str, torch.Tensor]) -> float:
        ids = batch["input_ids"]
        if family == "llama":
            loss = model(ids, labels=ids).loss
        else:
            loss = model(ids, attention_mask=batch["attention_mask"], mlm_labels=batch["labels"])
            loss = loss.loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return float(loss)

    return step


def contenders(family: str, seq: int, root: Path, window: int = 0) -> dict[str, Step]:
    """The family's Hugging Face model(s) and tpformer's, from the same weights."""
    torch.manual_seed(0)
    hf = hf_llama(seq) if family == "llama" else hf_modernbert(seq, window=window)
    directory = root / family
    hf.save_pretrained(directory)
    steps = {f"transformers {type(hf).__name__}": _hf_step(hf)}
    if family == "modernbert":
        sparse = hf_modernbert(seq, sparse=True, window=window)
        sparse.load_state_dict(hf.state_dict())
        steps["transformers, sparse_prediction=True"] = _hf_step(sparse)
    steps["tpformer TP=1"] = _tpformer_step(directory, family)
    return steps


def run(
    family: str, *, rounds: int, batch: int, seq: int, root: Path, window: int = 0
) -> list[dict]:
    """Median step seconds of each contender over `rounds` interleaved rounds (one warm-up)."""
    steps = contenders(family, seq, root, window)
    vocab = preset("llama_tiny" if family == "llama" else "modernbert_tiny").vocab_size
    data = batches(family, vocab, batch, seq, rounds + 1)
    first = {name: step(data[0]) for name, step in steps.items()}  # warm-up, same batch
    times: dict[str, list[float]] = {name: [] for name in steps}
    for b in data[1:]:
        for name, step in steps.items():
            start = time.perf_counter()
            step(b)
            times[name].append(time.perf_counter() - start)
    reference = statistics.median(next(iter(times.values())))
    rows = []
    for name, ts in times.items():
        median = statistics.median(ts)
        rows.append(
            {
                "family": family,
                "contender": name,
                "step_ms": 1000 * median,
                "tokens_per_s": batch * seq / median,
                "vs_hf": reference / median,
                "first_loss": first[name],
            }
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--families", nargs="+", default=["llama", "modernbert"])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--window", type=int, default=0, help="ModernBERT's local window")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"{args.threads} threads, batch {args.batch} x seq {args.seq}, {args.rounds} rounds")
    print("| family | contender | step (ms) | tokens/s | speed vs HF | first loss |")
    print("|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as root:
        for family in args.families:
            for r in run(
                family,
                rounds=args.rounds,
                batch=args.batch,
                seq=args.seq,
                root=Path(root),
                window=args.window,
            ):
                print(
                    f"| {r['family']} | {r['contender']} | {r['step_ms']:.1f} | "
                    f"{r['tokens_per_s']:,.0f} | {r['vs_hf']:.2f}x | {r['first_loss']:.4f} |"
                )


if __name__ == "__main__":
    main()
