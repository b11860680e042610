"""`--help` of the Hydra console scripts comes from the schema (config/help.py): the command's
description, its groups with the options it accepts, every key with default, values and
docstring; `--help GROUP` narrows it; lines fit a terminal."""

from __future__ import annotations

import importlib
import sys

import pytest

SCRIPTS = {
    "tpformer-pretrain": "tpformer.cli.pretrain",
    "tpformer-finetune": "tpformer.cli.finetune",
    "tpformer-generate": "tpformer.cli.generate",
    "tpformer-eval-lm": "tpformer.cli.eval_lm",
}


def _help(
    module: str,
    args: list[str],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> tuple[int, str, str]:
    monkeypatch.setattr(sys, "argv", ["x", *args])
    main = importlib.import_module(module).main
    with pytest.raises(SystemExit) as exit_:
        main()
    out = capsys.readouterr()
    return int(exit_.value.code or 0), out.out, out.err


@pytest.mark.parametrize("command", sorted(SCRIPTS))
def test_help_describes_every_key_from_the_schema(
    command: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    code, out, _ = _help(SCRIPTS[command], ["--help"], capsys, monkeypatch)
    assert code == 0
    assert out.startswith(f"`{command}`: ")
    assert "  parallel.tensor = 1  (int >= 1 or str)\n      TP degree: must divide" in out
    assert "is powered by Hydra" not in out
    assert max(len(line) for line in out.splitlines()) <= 100


def test_groups_show_only_the_options_the_command_takes(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    _, pretrain, _ = _help(SCRIPTS["tpformer-pretrain"], ["--help"], capsys, monkeypatch)
    assert "model=OPTION, one of: bert_base, bert_large" in pretrain
    assert "data=OPTION, one of: hf, jsonl, shakespeare, synthetic, text" in pretrain
    _, finetune, _ = _help(SCRIPTS["tpformer-finetune"], ["--help"], capsys, monkeypatch)
    assert "optim=OPTION, one of:" in finetune
    assert "data=OPTION" not in finetune and "model=" not in finetune
    assert "  init = required  (str)" in finetune


def test_help_narrows_to_one_group_and_names_a_wrong_one(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    code, out, _ = _help(SCRIPTS["tpformer-pretrain"], ["--help", "parallel"], capsys, monkeypatch)
    assert code == 0 and out.startswith("parallel=OPTION, one of: default\n")
    assert "parallel.zero_stage" in out and "optim." not in out
    code, _, err = _help(SCRIPTS["tpformer-pretrain"], ["--help", "paralel"], capsys, monkeypatch)
    assert code == 2
    assert "error: --help paralel: tpformer-pretrain has no config group paralel" in err


def test_help_shows_the_values_the_run_would_take(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The default preset's (bert_mini: hidden 256), not the schema's (768); a preset or key
    given beside --help is applied too; a variant group shows whether it is set."""
    pretrain = SCRIPTS["tpformer-pretrain"]
    _, out, _ = _help(pretrain, ["--help", "model"], capsys, monkeypatch)
    assert "  model.hidden_size = 256  (int >= 1)" in out
    assert "  model.rotary = null  (a group or null)" in out
    llama = ["model=llama_tiny", "model.rotary.theta=5e5", "--help", "model"]
    _, out, _ = _help(pretrain, llama, capsys, monkeypatch)
    assert "  model.rotary = set  (a group or null)" in out
    assert "  model.rotary.theta = 500000.0  (float > 0)" in out
    assert "  model.norm.kind = rmsnorm  (layernorm, rmsnorm)" in out


def test_plan_help_lists_its_flags_and_every_key(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    code, out, _ = _help("tpformer.cli.plan", ["--help"], capsys, monkeypatch)
    assert code == 0
    assert "--json" in out and "--calibrate" in out
    assert "  plan.dry_run = false  (bool)" in out
    assert "  model.hidden_size = 256  (int >= 1)" in out
