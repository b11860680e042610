"""tpformer-generate and tpformer-eval-lm as a user runs them: GPT pretrained through the CLI on
the default corpus, resumed, exported with tpformer-convert and loaded by transformers, whose
greedy tokens and perplexity the commands reproduce at TP=2; a Hugging Face GPT-2 directory
generated from directly and imported to continue pretraining; bad input exits with one line."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from tests.cli.forked import run_script
from tests.docs.commands import arguments, documented
from tests.inference.tiny_gpt2 import save_tiny_gpt2
from tests.train.test_trainer import QUIET, REPO
from tpformer.config.schema import GenerateConfig
from tpformer.inference.perplexity import sliding_windows

ENV = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
TINY_GPT = [
    "model=gpt2_small",
    "model.num_layers=2",
    "model.hidden_size=64",
    "model.num_heads=4",
    "model.intermediate_size=256",
    "model.max_position_embeddings=64",
    "model.vocab_size=1000",
    "data.seq_length=32",
    "trainer.micro_batch_size=4",
    "trainer.progress=false",
    "trainer.log_every=2",
    *QUIET,
]
TEXT = "To be, or not to be, that is the question: whether 'tis nobler in the mind to suffer"


def _run(module: str, *args: str, cwd: Path, check: bool = True) -> subprocess.CompletedProcess:
    done = run_script(f"tpformer.cli.{module}", args, cwd=cwd, env=ENV, timeout=600)
    if check:
        assert done.returncode == 0, done.stderr[-3000:]
    return done


@pytest.mark.slow
def test_pretrain_resume_export_generate_and_evaluate(tmp_path: Path) -> None:
    """docs/generation.md's walkthrough and README's generate and eval-lm commands, in that
    order, shrunk (the test's sizes below; 4 steps, then 2 more resumed): the TP=2 greedy
    completion is transformers' on the exported model, and the one-process one the same; the
    perplexity is transformers' over the same sliding windows."""
    import sentencepiece as spm
    import transformers

    shrink = {
        "model.num_layers=4": "model.num_layers=2",
        "model.hidden_size=128": "model.hidden_size=64",
        "model.intermediate_size=512": "model.intermediate_size=256",
        "model.vocab_size=4000": "model.vocab_size=1000",
        "trainer.micro_batch_size=16": "trainer.micro_batch_size=4",
        "trainer.max_steps=400 trainer.save_every=400": "trainer.max_steps=4 trainer.save_every=4",
    }
    pretrain = documented("tpformer-pretrain model=gpt2_small model.num_layers=4")
    quiet = ["trainer.progress=false", "trainer.log_every=2", *QUIET]
    _run("pretrain", *arguments(pretrain, shrink)[1], *quiet, cwd=tmp_path)
    resumed = _run("pretrain", *arguments(pretrain, shrink)[1], *quiet, "trainer.max_steps=6",
                   "trainer.save_every=6", "trainer.resume=auto", cwd=tmp_path)  # fmt: skip
    assert "resumed from" in resumed.stderr
    step = {"step00000400": "step00000006"}
    _run(
        "convert", *arguments(documented("tpformer-convert to-hf runs/gpt"), step)[1], cwd=tmp_path
    )
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf" / "gpt").eval()
    sp = spm.SentencePieceProcessor(model_file=str(tmp_path / "hf" / "gpt" / "tokenizer.model"))

    completions = {}
    for name, command in (  # README's at TP=2, docs/generation.md's in one process
        (
            "tp2",
            documented(
                "tpformer-generate init=runs/gpt/checkpoints/step00000400 'prompt=\"ROMEO:\"' "
                "max_new_tokens=40 parallel.tensor=2"
            ),
        ),
        (
            "one",
            documented(
                "tpformer-generate init=runs/gpt/checkpoints/step00000400 'prompt=\"ROMEO:\"' "
                "max_new_tokens=40"
            ),
        ),
    ):
        _run("generate", *arguments(command, step)[1], f"hydra.run.dir={tmp_path / name}",
             cwd=tmp_path)  # fmt: skip
        completions[name] = json.loads((tmp_path / name / "completions.jsonl").read_text())
    ids = sp.encode("ROMEO:")
    want = hf.generate(torch.tensor([ids]), max_new_tokens=40, do_sample=False, pad_token_id=0)[
        0, len(ids) :
    ].tolist()
    assert completions["tp2"]["output_ids"] == want, (completions["tp2"], want)
    assert completions["one"]["output_ids"] == want
    assert completions["tp2"]["text"] == sp.decode(ids + want)[len(sp.decode(ids)) :]

    (tmp_path / "valid.txt").write_text(TEXT * 16)
    evaluate = documented("tpformer-eval-lm init=runs/gpt")
    _run("eval_lm", *arguments(evaluate, step)[1], f"hydra.run.dir={tmp_path / 'ppl'}",
         cwd=tmp_path)  # fmt: skip
    got = json.loads((tmp_path / "ppl" / "eval_lm.json").read_text())
    stream = torch.tensor(sp.encode(TEXT * 16))
    nll, count = 0.0, 0
    with torch.no_grad():
        for w in sliding_windows(len(stream), 128, 64):
            logits = hf(stream[None, w.begin : w.end]).logits[0, :-1]
            targets = stream[w.begin + 1 : w.end].clone()
            targets[: w.scored_from - w.begin - 1] = -100
            nll += float(F.cross_entropy(logits, targets, reduction="sum"))
            count += int((targets != -100).sum())
    want_ppl = float(torch.tensor(nll / count).exp())
    assert got["scored_tokens"] == count
    assert abs(got["perplexity"] - want_ppl) <= 1e-4 * want_ppl, (got, want_ppl)


@pytest.mark.slow
def test_a_hugging_face_gpt2_generates_and_continues_pretraining(tmp_path: Path) -> None:
    directory = save_tiny_gpt2(tmp_path / "gpt2")
    done = _run("generate", f"init={directory}", "prompt='To be, or not'", "max_new_tokens=8",
                f"hydra.run.dir={tmp_path / 'gen'}", cwd=tmp_path)  # fmt: skip
    record = json.loads((tmp_path / "gen" / "completions.jsonl").read_text())
    assert len(record["output_ids"]) == 8 or record["output_ids"][-1] == 0
    assert done.stdout.startswith("To be, or not" + record["text"]), done.stdout  # streamed
    _run("convert", "from-hf", str(directory), str(tmp_path / "back"), cwd=tmp_path)
    config = json.loads((directory / "config.json").read_text())
    continued = _run(  # the model comes from the checkpoint: no model.* repeated
        "pretrain",
        "model.dropout=0.0",
        "data=synthetic",
        "data.seq_length=32",
        "trainer.micro_batch_size=4",
        "trainer.max_steps=2",
        "trainer.progress=false",
        f"trainer.resume={tmp_path / 'back' / 'checkpoints' / 'step00000000'}",
        f"hydra.run.dir={tmp_path / 'run'}",
        cwd=tmp_path,
    )
    assert f"gpt2, 2 layers, hidden 64, 4 heads, vocabulary {config['vocab_size']}" in (
        continued.stderr
    )
    assert f"model.dropout=0.0 applied over its {config['resid_pdrop']}" in continued.stderr
    assert "resumed from" in continued.stderr and "done: step 2" in continued.stderr


def _composed(*overrides: str) -> GenerateConfig:
    from hydra import compose, initialize_config_dir

    from tpformer.config.store import CONF_DIR, register_configs, to_config

    register_configs()
    with initialize_config_dir(config_dir=CONF_DIR, version_base=None):
        return to_config(compose("generate", overrides=["init=nowhere", *overrides]))


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "give one of prompt=<text> (one prompt) or prompts=<file>"),
        (["prompt=a", "prompts=b.txt"], "give one of prompt=<text>"),
        (["prompt=a", "parallel.pipeline=2"],
         "parallel.pipeline=2: generation and evaluation keep the whole model"),
        (["prompt=a", "parallel.tensor=2", "parallel.sequence_parallel=true"],
         "decoding runs one token per step"),
        (["prompt=a", "top_p=1.5"], "top_p=1.5 must be in (0, 1]"),
    ],
)  # fmt: skip
def test_bad_generation_settings_name_the_key(args: list[str], message: str) -> None:
    from tpformer.cli.generate import validate_generate
    from tpformer.cli.shell import resolve

    config = _composed(*args)
    with pytest.raises(ValueError, match=re.escape(message)):
        validate_generate(config, resolve(config, 2))
