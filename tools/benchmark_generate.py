"""Generation speed: prefill and decode tokens/s of tpformer-generate's loop at TP=1 and TP=2
next to transformers' GPT2LMHeadModel.generate (its KV cache), greedy, on the same weights.

    python tools/benchmark_generate.py                       # gpt2_small shape, batch 1 and 8
    python tools/benchmark_generate.py --layers 2 --new 8    # a quick look

The weights are gpt2_small-shaped and random (saved once with save_pretrained, loaded by both).
transformers and TP=1 run in one process with every core; TP=2 runs two gloo processes with
one core each. Prefill time is a generation of one token; decode time is the rest of a
generation of --new tokens (forced: no end-of-text stops either)."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from tpformer.convert import load_causal_lm
from tpformer.inference.generation import GenerationSettings, generate
from tpformer.inference.sampling import Sampling
from tpformer.parallel.context import ParallelContext


def save_weights(directory: Path, layers: int) -> None:
    import transformers

    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=layers, eos_token_id=None, bos_token_id=None)
    transformers.GPT2LMHeadModel(config).save_pretrained(directory)


def prompts(batch: int, length: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(1)
    return torch.randint(0, 50257, (batch, length), generator=g).tolist()


def timed(run: Callable[[int], object], new: int, rounds: int) -> tuple[float, float]:
    """(prefill s, decode s): medians over rounds after one warm-up."""
    prefill, total = [], []
    for round_ in range(rounds + 1):
        start = time.perf_counter()
        run(1)
        middle = time.perf_counter()
        run(new)
        end = time.perf_counter()
        if round_:
            prefill.append(middle - start)
            total.append(end - middle)
    first = statistics.median(prefill)
    return first, max(statistics.median(total) - first, 1e-9)


def tpformer_times(ctx: ParallelContext, directory: Path, args: argparse.Namespace) -> dict:
    model, _, _ = load_causal_lm(directory, ctx)
    model.eval()
    out = {}
    for batch in args.batch:
        ids = prompts(batch, args.prompt_len)

        def run(new: int, ids: list[list[int]] = ids) -> object:
            settings = GenerationSettings(new, Sampling())
            return generate(model, ids, settings, torch.Generator())

        out[batch] = timed(run, args.new, args.rounds)
    return out


def transformers_times(directory: Path, args: argparse.Namespace) -> dict:
    import transformers

    model = transformers.GPT2LMHeadModel.from_pretrained(directory).eval()
    out = {}
    for batch in args.batch:
        ids = torch.tensor(prompts(batch, args.prompt_len))

        def run(new: int, ids: torch.Tensor = ids) -> object:
            with torch.no_grad():
                return model.generate(
                    ids,
                    attention_mask=torch.ones_like(ids),
                    max_new_tokens=new,
                    min_new_tokens=new,
                    do_sample=False,
                    pad_token_id=0,
                )

        out[batch] = timed(run, args.new, args.rounds)
    return out


def _tp_worker(rank: int, world: int, store: str, directory: str, args: argparse.Namespace,
               out: str) -> None:  # fmt: skip
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"file://{store}", rank=rank, world_size=world,
        timeout=timedelta(seconds=1800),
    )  # fmt: skip
    ctx = ParallelContext.create(tensor=world, device=torch.device("cpu"))
    result = tpformer_times(ctx, Path(directory), args)
    if rank == 0:
        Path(out).write_text(json.dumps(result))
    ctx.destroy()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--new", type=int, default=32)
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    cores = os.cpu_count() or 1
    work = Path(tempfile.mkdtemp(prefix="tpformer-gen-"))
    save_weights(work / "gpt2", args.layers)
    torch.set_num_threads(cores)
    results = {"transformers": transformers_times(work / "gpt2", args)}
    results["tpformer TP=1"] = tpformer_times(
        ParallelContext.single(device="cpu"), work / "gpt2", args
    )
    out = work / "tp2.json"
    mp.spawn(_tp_worker, args=(2, str(work / "store"), str(work / "gpt2"), args, str(out)),
             nprocs=2)  # fmt: skip
    results["tpformer TP=2"] = {int(k): v for k, v in json.loads(out.read_text()).items()}
    print(
        f"GPT-2 small shape ({args.layers} layers), random weights, greedy; prompt "
        f"{args.prompt_len} tokens, {args.new} new; {cores} cores; median of {args.rounds}"
    )
    print("| batch | run | prefill tokens/s | decode tokens/s | prefill vs HF | decode vs HF |")
    print("|---|---|---|---|---|---|")
    for batch in args.batch:
        hf_prefill, hf_decode = results["transformers"][batch]
        for name, times in results.items():
            prefill, decode = times[batch]
            print(
                f"| {batch} | {name} | {batch * args.prompt_len / prefill:,.0f} | "
                f"{batch * (args.new - 1) / decode:,.1f} | {hf_prefill / prefill:.2f}x | "
                f"{hf_decode / decode:.2f}x |"
            )


if __name__ == "__main__":
    main()
