# ruff: noqa: E501  (one case per line: the table reads as a table)
"""One error contract for every console script (README, cli/shell.py): each bad input a
newcomer meets — a typo, a `+key` the schema lacks, an invalid value, a missing or wrong file,
path or checkpoint, a model that does not fit the job — exits 2 with one line in our words
naming the value, before any process starts and before a run directory is kept."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.cli.bad_input_cases import run_cases
from tests.inference.tiny_gpt2 import save_tiny_gpt2

REPO = Path(__file__).resolve().parents[2]
PRETRAIN = "tpformer.cli.pretrain:main"
FINETUNE = "tpformer.cli.finetune:main"
GENERATE = "tpformer.cli.generate:main"
EVAL_LM = "tpformer.cli.eval_lm:main"
PLAN = "tpformer.cli.plan:main"
CONVERT = "tpformer.cli.convert:main"
PREPROCESS = "tpformer.cli.data:preprocess_main"
TOKENIZER = "tpformer.cli.data:train_tokenizer_main"

CASES: list[tuple[str, list[str], str]] = [
    # typos and keys the schema does not have
    (PRETRAIN, ["parallel.tensr=2"], "parallel.tensr is not a config key; did you mean parallel.tensor?"),
    (PRETRAIN, ["+parallel.tensr=2"], "parallel.tensr is not a config key; did you mean parallel.tensor?"),
    (FINETUNE, ["task=sst2", "trainer.epoch=1"], "did you mean trainer.epochs?"),
    (FINETUNE, ["task=sst2", "model.hidden_size=64"], "model.hidden_size is not a config key; the keys of model are attention_dropout, dropout"),
    (GENERATE, ["init={gpt2}", "max_new_token=4"], "did you mean max_new_tokens?"),
    (EVAL_LM, ["+strid=2"], "strid is not a config key; did you mean stride?"),
    (PLAN, ["cluster.nodez=2"], "did you mean cluster.nodes?"),
    (PREPROCESS, ["data.seq_lenght=64"], "did you mean data.seq_length?"),
    (PLAN, ["parallel.checkpoint_every=2"], "was renamed parallel.recompute_every"),
    (PRETRAIN, ["model=bert_tnyy"], "model=bert_tnyy is not one of its options; did you mean model=bert_tiny? the options: bert_base,"),
    (PLAN, ["optim=adamx"], "optim=adamx is not one of its options; did you mean optim=adamw?"),
    (PRETRAIN, ["trainer.profile=[2,3]"], "trainer.profile=[2,3]: trainer.profile is a group of keys, not a value; set them one by one: trainer.profile.start,"),
    (FINETUNE, ["task=sst2", "model=bert_base"], "model=bert_base: model is a group of keys, not a value; set them one by one: model.dropout, model.attention_dropout"),
    (PRETRAIN, ["model=llama_tiny", "model.rope_theta=5e5"], "model.rope_theta was renamed model.rotary.theta (the model's variants are groups now: mlp, norm, rotary, local_attention); write model.rotary.theta=5e5"),
    (PLAN, ["model.pre_norm=true"], "model.pre_norm was replaced (the model's variants are groups now: mlp, norm, rotary, local_attention): write model.norm.position=pre"),
    # the model's variant groups (rotary, local_attention: absent when off)
    (PRETRAIN, ["model.rotary.theta=5e5"], "model.rotary.theta=5e5: model=bert_mini has no model.rotary (null); turn it on first: +model/rotary=on model.rotary.theta=5e5"),
    (PLAN, ["model/local_attention=on"], "model/local_attention=on: a variant group is added: write +model/local_attention=on"),
    (PRETRAIN, ["model=modernbert_tiny", "+model/rotary=on"], "model=modernbert_tiny has model.rotary already (the option would reset it to the defaults)"),
    # invalid values and layouts
    (PRETRAIN, ["parallel.zero_stage=5"], "parallel.zero_stage=5 is not one of 0, 1, 2, 3"),
    (PRETRAIN, ["parallel.tensor=3"], "parallel.tensor=3 does not divide world_size=1"),
    (PRETRAIN, ["data.pack=true"], "data.pack=true packs MLM-only samples; data.sentence_pairs=nsp makes sentence pairs: set data.sentence_pairs=none"),
    (PRETRAIN, ["model=modernbert_tiny", "data=synthetic", "data.pack=true"], "data.pack=true packs a corpus's documents, and data.source=synthetic has none"),
    (PRETRAIN, ["model=llama_tiny", "data.pack=true", "parallel.context=2", "launcher.nproc_per_node=2"], "data.pack=true runs without context parallelism (parallel.context=2): ring attention takes a key padding mask"),
    (PRETRAIN, ["parallel.precision=fp8", "model.intermediate_size=1000"], "parallel.precision=fp8 needs every linear width a multiple of 16 (the GPUs' fp8 matmuls): model.intermediate_size / parallel.tensor=1 is 1000"),
    (FINETUNE, ["task=sst3", "init={bert}"], "task=sst3 is not one of cola, sst2"),
    (FINETUNE, ["task=sst2", "init={bert}", "model.dropout=1.5"], "model.dropout=1.5 must be in [0, 1)"),
    (GENERATE, ["init={gpt2}", "prompt=a", "top_p=1.5"], "top_p=1.5 must be in (0, 1]"),
    (GENERATE, ["init={gpt2}", "prompt=a, b"], "Hydra reads the commas as a sweep"),
    (GENERATE, ["init={gpt2}", "prompt=a (b"], "quote it for the shell and Hydra: 'prompt=\"a (b\"'"),
    (EVAL_LM, ["init={gpt2}", "data_file={text}", "stride=64", "seq_length=32"], "stride=64 exceeds seq_length=32"),
    (PLAN, ["cluster.name=h100"], "cluster.name=h100 only labels a cluster and picks no preset"),
    (PREPROCESS, ["data=synthetic"], "synthetic"),
    # required keys
    (FINETUNE, ["task=sst2"], "init is required: give init=..."),
    (EVAL_LM, ["init={gpt2}"], "data_file is required: give data_file=..."),
    # missing files, paths and checkpoints
    (PRETRAIN, ["data=text", "data.paths=[{tmp}/none.txt]"], "data.paths={tmp}/none.txt: no such file or directory"),
    (PRETRAIN, ["data.tokenizer={tmp}/none.model"], "data.tokenizer={tmp}/none.model: no such file"),
    (PRETRAIN, ["data.source=megatron", "data.paths=[{tmp}/none_text_document]", "data.tokenizer={tmp}/none.model"], "data.paths={tmp}/none_text_document: no Megatron dataset there ({tmp}/none_text_document.bin and {tmp}/none_text_document.idx not found)"),
    (PRETRAIN, ["trainer.resume={tmp}/none"], "trainer.resume={tmp}/none is not a directory"),
    (PRETRAIN, ["trainer.resume={tmp}"], "trainer.resume={tmp} has neither meta.json nor config.json"),
    (PRETRAIN, ["trainer.resume={damaged}"], "meta.json is unreadable"),
    (PRETRAIN, ["trainer.resume={truncated}", "launcher.nproc_per_node=2"], "trainer.resume={truncated}: {truncated}/__0_0.distcp has 100 bytes but"),
    (FINETUNE, ["task=sst2", "init={truncated}", "launcher.nproc_per_node=2"], "init={truncated}: {truncated}/__0_0.distcp has 100 bytes but"),
    (FINETUNE, ["task=sst2", "init={tmp}/none"], "init={tmp}/none is not a directory"),
    (FINETUNE, ["task=classification", "init={bert}"], "task=classification reads your own files: set data.train_file and data.dev_file"),
    (FINETUNE, ["task=sst2", "init={bert}", "data.label_column=stars"], "data.label_column applies to task=classification, regression or multilabel; task=sst2 reads GLUE's own columns"),
    (FINETUNE, ["task=sst2", "init=nobody/no-such-bert@v1"], "init=nobody/no-such-bert@v1 is not a local directory, and the Hugging Face Hub model nobody/no-such-bert@v1 is not in the cache"),
    (FINETUNE, ["task=sst2", "init={bert}", "data.train_file={tmp}/none.tsv"], "data.train_file={tmp}/none.tsv: no such file"),
    (GENERATE, ["init={tmp}/none", "prompt=a"], "init={tmp}/none is not a directory"),
    (GENERATE, ["init={gpt2}", "prompts={tmp}/none.txt"], "prompts={tmp}/none.txt: no such file"),
    (EVAL_LM, ["init={gpt2}", "data_file={tmp}/none.txt"], "data_file={tmp}/none.txt: no such file"),
    (CONVERT, ["to-hf", "{tmp}/none", "{tmp}/out"], "{tmp}/none"),
    (CONVERT, ["from-hf", "{tmp}/none", "{tmp}/out"], "{tmp}/none"),
    (TOKENIZER, ["data=text", "data.paths=[{tmp}/none.txt]"], "data.paths={tmp}/none.txt: no such file"),
    # a model that does not fit the job
    (FINETUNE, ["task=sst2", "init={gpt2}"], "holds a gpt model; fine-tuning needs a BERT"),
    (GENERATE, ["init={bert}", "prompt=a"], "holds a bert model; generation needs a GPT"),
    (FINETUNE, ["task=sst2", "init={bert}", "parallel.tensor=3", "launcher.nproc_per_node=3"], "parallel.tensor=3 must divide model.num_heads=2 (valid: [1, 2]) (the model of init={bert})"),
    (GENERATE, ["init={gpt2}", "prompt=a", "parallel.tensor=3", "launcher.nproc_per_node=3"], "parallel.tensor=3 must divide model.num_heads=4 (valid: [1, 2, 4]) (the model of init={gpt2})"),
    (EVAL_LM, ["init={bert}", "data_file={text}"], "holds a bert model; tpformer-eval-lm needs a GPT"),
    (GENERATE, ["init={untokenized}", "prompt=a"], "prompt is text, and init={untokenized} has no tokenizer"),
    (EVAL_LM, ["init={untokenized}", "data_file={text}"], "data_file is text, and init={untokenized} has no tokenizer"),
    (PRETRAIN, ["trainer.resume={checkpoint}", "model.hidden_size=64"], "model.hidden_size=64 contradicts the checkpoint trainer.resume={checkpoint}"),
    (PRETRAIN, ["trainer.resume={checkpoint}", "model=bert_base"], "model=bert_base contradicts the checkpoint"),
]  # fmt: skip


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Real directories of each kind: a Hugging Face BERT and GPT-2 (save_pretrained), a GPT-2
    without tokenizer files, a tpformer checkpoint (from-hf), one with a damaged meta.json, one
    with a truncated shard."""
    import transformers

    from tpformer.convert import from_hf

    root = tmp_path_factory.mktemp("inputs")
    bert = root / "bert"
    config = transformers.BertConfig(
        vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=64, max_position_embeddings=64,
    )  # fmt: skip
    transformers.BertForPreTraining(config).save_pretrained(bert)
    gpt2 = save_tiny_gpt2(root / "gpt2")
    untokenized = root / "untokenized"
    untokenized.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(gpt2 / name, untokenized / name)
    checkpoint = from_hf(bert, root / "imported")
    damaged = root / "damaged"
    shutil.copytree(checkpoint, damaged)
    (damaged / "meta.json").write_text("{not json")
    truncated = root / "truncated"
    shutil.copytree(checkpoint, truncated)
    shard = truncated / "__0_0.distcp"
    shard.write_bytes(shard.read_bytes()[:100])
    text = root / "text.txt"
    text.write_text("To be, or not to be, that is the question.\n")
    return {
        "bert": bert,
        "gpt2": gpt2,
        "untokenized": untokenized,
        "checkpoint": checkpoint,
        "damaged": damaged,
        "truncated": truncated,
        "text": text,
    }


@pytest.mark.slow  # over ~5 s: the slow tier
def test_every_bad_input_exits_2_with_one_line_and_no_run_directory(
    tmp_path: Path, inputs: dict[str, Path]
) -> None:
    names = {"tmp": tmp_path / "work", **inputs}
    names["tmp"].mkdir()

    def filled(text: str) -> str:
        for name, path in names.items():
            text = text.replace(f"{{{name}}}", str(path))
        return text

    cases = [(script, [filled(a) for a in argv], str(names["tmp"])) for script, argv, _ in CASES]
    env = {
        "COLUMNS": "100",
        "HF_HUB_OFFLINE": "1",  # a Hub id resolves from this empty cache only
        "HF_HUB_CACHE": str(tmp_path / "hub"),
    }
    outcomes = run_cases(cases, env, timeout=300)
    failures = []
    for (script, argv, message), (code, _, stderr, left) in zip(CASES, outcomes):
        lines = stderr.splitlines()
        ok = (
            code == 2
            and len(lines) == 1
            and lines[0].startswith("error: ")
            and filled(message) in lines[0]
            and not left
        )
        if not ok:
            failures.append(f"{script} {' '.join(argv)}: exit {code}, {stderr!r}, left {left}")
    assert failures == []
