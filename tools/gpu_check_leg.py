"""gpu_check's multi-GPU leg: 2-rank layouts (TP=2, TP=2 + SP, CP=2, pipeline=2 with 1F1B,
DP=2 with ZeRO-3) trained through the real trainer under torchrun (NCCL on GPUs, gloo on the
CPU), each compared with the one-device run on the same batches: under parallel.rng=exact their
losses must agree within LAYOUT_REL, then the same layouts' throughput under fast.

A worker is this file run by torch.distributed.run with a JSON spec: one launch runs every
layout of one parallel.rng mode in turn on the one process group (each layout its own mesh and
trainer; the start-up of torch, the ranks and NCCL is paid once, not five times), and rank 0
writes each layout's losses and tokens/s, or its error, to a JSON file. A layout that raises is
reported failed and the next one runs. Needs only torch (the configs are the typed schema, no
Hydra).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

LAYOUTS: list[tuple[str, dict[str, Any]]] = [
    ("TP=2", {"tensor": 2}),
    ("TP=2 + SP", {"tensor": 2, "sequence_parallel": True}),
    ("CP=2", {"context": 2}),
    ("PP=2 1F1B", {"pipeline": 2, "pipeline_schedule": "1f1b"}),
    ("DP=2 ZeRO-3", {"zero_stage": 3}),
]
LAYOUT_REL = {"cpu": 1e-5, "cuda": 1e-4}
"""Largest relative loss difference to the one-device run over the leg's steps (exact mode).
CPU: the layout tests' FP32_MODEL_REL. GPU: 10x that, for cuBLAS's and the fused attention
kernels' sum orders changing with the shard shapes; set by hand, not yet from a GPU run."""
GLOBAL_BATCH = 8


def leg_config(spec: dict[str, Any]) -> Any:
    """The pretraining Config of one run of the leg (fp32 for exact, bf16 on GPUs for fast)."""
    from tpformer.config.presets import preset
    from tpformer.config.schema import (
        Config,
        DataConfig,
        OptimConfig,
        ParallelConfig,
        TrainerConfig,
    )

    tiny, layout = spec["tiny"], spec["layout"]
    model = preset("bert_tiny" if tiny else "bert_base", vocab_size=512 if tiny else 30522)
    model = replace(model, num_heads=4 if tiny else model.num_heads)
    fast_gpu = spec["rng"] == "fast" and spec["device"] == "cuda"
    data_ranks = 2 if layout.get("zero_stage") else 1
    accum = 2 if layout.get("pipeline", 1) > 1 else 1
    parallel = ParallelConfig(rng=spec["rng"], precision="bf16" if fast_gpu else "fp32", **layout)  # type: ignore[arg-type]
    seq = 32 if tiny else 128
    batch = GLOBAL_BATCH if tiny else 32 * GLOBAL_BATCH
    return Config(
        model=model,
        parallel=parallel,
        optim=OptimConfig(lr=1e-3, warmup_steps=1),
        data=DataConfig(source="synthetic", seq_length=seq),  # type: ignore[arg-type]
        trainer=TrainerConfig(
            max_steps=spec["steps"],
            micro_batch_size=batch // (data_ranks * accum),
            grad_accum=accum,
            log_every=1,
            eval_steps=1,
            progress=False,
            loggers=[],
        ),
    )


def _train(spec: dict[str, Any], layout: dict[str, Any], run_dir: Path) -> dict[str, Any]:
    """One layout on this launch's ranks: its own mesh and trainer; rank 0's losses and mean
    tokens/s (the first step, with its warm-up, left out)."""
    from tpformer.config.validate import validate
    from tpformer.parallel.context import ParallelContext
    from tpformer.train.pretraining import pretraining_trainer

    config = leg_config({**spec, "layout": layout})
    p = config.parallel
    ctx = ParallelContext.create(
        p.tensor,
        "auto",
        seed=p.seed,
        sequence_parallel=p.sequence_parallel,
        pipeline=int(p.pipeline),
        rng=p.rng,
        context=p.context,
        timeout_s=300,
    )
    validate(config, ctx.layout, device_type=ctx.device.type)
    records = pretraining_trainer(config, ctx, run_dir).train()
    timed = [r["tokens_per_s"] for r in records[1:]] or [records[0]["tokens_per_s"]]
    return {"losses": [r["loss"] for r in records], "tokens_per_s": sum(timed) / len(timed)}


def worker(spec_json: str, out: str) -> None:
    """The ranks of one launch (under torch.distributed.run): every layout of spec["layouts"]
    in turn on the one process group, which is destroyed at the end."""
    import torch.distributed as dist

    spec = json.loads(spec_json)
    results: list[dict[str, Any]] = []
    try:
        for i, layout in enumerate(spec["layouts"]):
            try:
                results.append(_train(spec, layout, Path(spec["run_dir"]) / str(i)))
            except Exception as err:  # the row says so; the next layout runs
                results.append({"error": f"{type(err).__name__}: {err}"[:2000]})
    finally:
        rank = dist.get_rank() if dist.is_initialized() else 0
        if dist.is_initialized():
            dist.destroy_process_group()
    if rank == 0:
        Path(out).write_text(json.dumps(results))


def launch(spec: dict[str, Any], ranks: int, timeout_s: float) -> list[dict[str, Any]] | None:
    """Run spec["layouts"] on `ranks` local ranks in one launch; rank 0's result per layout
    ({"error": ...} for one that raised), or None if the launch failed as a whole."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        spec = {**spec, "run_dir": str(Path(tmp) / "run")}
        command = [
            sys.executable, "-m", "torch.distributed.run", "--standalone",
            f"--nproc_per_node={ranks}", __file__, json.dumps(spec), str(out),
        ]  # fmt: skip
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        try:
            done = subprocess.run(
                command, capture_output=True, text=True, timeout=timeout_s, env=env
            )
        except subprocess.TimeoutExpired:
            return None
        if done.returncode or not out.exists():
            print(done.stderr[-2000:], flush=True)
            return None
        return list(json.loads(out.read_text()))


def layout_leg(args: Any, world: int, started: float) -> bool:
    """Every layout at exact against the one-device exact run, then at fast; prints a row per
    layout and appends it to args.out. Whether every exact layout passed."""
    device = "cuda" if args.device.startswith("cuda") else "cpu"
    tol = LAYOUT_REL[device]
    steps = 4 if args.tiny else 20
    print(f"\nmulti-GPU leg ({min(world, 2)} ranks, {steps} steps, exact: within {tol:.0e})")
    ok = True
    for rng in args.leg_rngs.split(","):
        if args.budget_s - (time.perf_counter() - started) < 60:
            print(f"  the {rng} layouts: skipped (budget)")
            continue
        base = {"tiny": args.tiny, "device": device, "steps": steps, "rng": rng}
        reference = launch({**base, "layouts": [{}]}, 1, timeout_s=600)
        if reference is None or "error" in reference[0]:
            print(f"  one device ({rng}): failed {reference and reference[0].get('error')}")
            return False
        results = launch({**base, "layouts": [layout for _, layout in LAYOUTS]}, 2, 900)
        for i, (name, _) in enumerate(LAYOUTS):
            result = results[i] if results is not None else {"error": "the launch failed"}
            row = _row(name, rng, result, reference[0], tol)
            ok &= bool(row["passed"])
            with open(args.out, "a") as f:
                f.write(json.dumps(row) + "\n")
            print(f"  {json.dumps(row)}", flush=True)
    return ok


def _row(
    name: str, rng: str, result: dict[str, Any], reference: dict[str, Any], tol: float
) -> dict[str, Any]:
    """A layout's row: its largest relative loss gap to one device and its tokens/s ratio."""
    row: dict[str, Any] = {"leg": name, "rng": rng, "ranks": 2}
    if "error" in result:
        return row | {"passed": False, "error": result["error"]}
    gap = max(abs(a - b) / abs(b) for a, b in zip(result["losses"], reference["losses"]))
    row |= {
        "max_rel_gap": gap,
        "tokens_per_s": result["tokens_per_s"],
        "vs_one_device": result["tokens_per_s"] / reference["tokens_per_s"],
    }
    return row | {"passed": rng == "fast" or gap <= tol}


if __name__ == "__main__":
    worker(sys.argv[1], sys.argv[2])
