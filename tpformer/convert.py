"""Between tpformer checkpoints and Hugging Face directories, in one process; above the engine
and checkpoint I/O, which it uses.

to_hf:   a checkpoint's logical parameters -> the tpformer model of the task it trained
         (meta.json "task": pretraining, causal_lm or classification) -> save_pretrained, with a
         tokenizer that AutoTokenizer loads and that gives the run's ids.
from_hf: a HF directory -> the tpformer model -> a step-0 checkpoint (fresh optimizer state)
         that `trainer.resume=<dir>` continues from at any layout.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any, cast

from tpformer.checkpoint import store
from tpformer.checkpoint.source import (
    CHECKPOINT,
    read_model_source,
    require_arch,
    saved_model_config,
)
from tpformer.config.schema import Arch, OptimConfig, ParallelConfig
from tpformer.engine.parallelize import parallelize
from tpformer.engine.state import parameter_template
from tpformer.interop.hf import load_hf_model, save_hf_checkpoint, task_of
from tpformer.interop.hf_files import read_hf_config
from tpformer.interop.hf_tokenizer import export_tokenizer
from tpformer.interop.hub import resolve_model_dir
from tpformer.models import BertForSequenceClassification, GPTForCausalLM, TPModel, build_model
from tpformer.parallel.context import ParallelContext

DEFAULT_TASK = {"bert": "pretraining", "gpt": "causal_lm"}
"""The task of checkpoints written before meta.json recorded one (pretraining runs)."""


def load_checkpoint_model(checkpoint: Path, ctx: ParallelContext) -> TPModel:
    """The model a checkpoint trained, at ctx's layout, with its saved parameters."""
    meta = store.verify(checkpoint)
    config = saved_model_config(meta, checkpoint)
    task = str(meta.get("task", DEFAULT_TASK[config.arch]))
    extra = {"num_labels": int(meta["num_labels"])} if task == "classification" else {}
    model = build_model(config, ctx, task=task, initialize=False, **extra)
    params = list(model.named_parameters())
    template = {"engine": parameter_template(params)}
    store.load(checkpoint, template)
    model.load_full_state_dict({n: template["engine"][f"param/{n}"] for n, _ in params})
    return model


def to_hf(checkpoint: Path, out: Path) -> Path:
    """Write the checkpoint's model as a HF directory: BertForPreTraining, GPT2LMHeadModel or
    BertForSequenceClassification (num_labels, id2label; regression for STS-B), with a
    tokenizer that AutoTokenizer loads and that gives the run's ids."""
    meta = store.read_meta(checkpoint)
    ctx = ParallelContext.single(device="cpu")
    model = load_checkpoint_model(checkpoint, ctx)
    labels = meta.get("id2label")
    id2label = {int(k): v for k, v in labels.items()} if isinstance(labels, dict) else None
    tokenizer = checkpoint / store.TOKENIZER_DIR
    special_ids = export_tokenizer(tokenizer, out, model.config.arch)
    save_hf_checkpoint(
        model,
        ctx,
        out,
        id2label=id2label,
        special_ids=special_ids,
        problem_type=meta.get("problem_type"),
    )
    return out


def from_hf(hf_dir: Path | str, out_root: Path) -> Path:
    """A step-0 tpformer checkpoint under out_root/checkpoints with the HF weights; hf_dir is a
    directory or a Hugging Face Hub id (interop/hub.py)."""
    source = str(hf_dir)
    hf_dir = resolve_model_dir(hf_dir, "from-hf")
    if not (hf_dir / "config.json").is_file():
        raise FileNotFoundError(
            f"from-hf {source}: {hf_dir} has no config.json; give a directory written by "
            "save_pretrained or a Hugging Face Hub id (name or org/name, @revision)"
        )
    ctx = ParallelContext.single(device="cpu")
    model = load_hf_model(hf_dir, ctx, task=None)
    parallel = ParallelConfig()
    engine = parallelize(model, parallel, OptimConfig(), ctx).engine
    task = task_of(model)
    extra = {"num_labels": model.num_labels} if task == "classification" else {}
    meta = {
        **store.checkpoint_meta(
            model.config,
            parallel,
            ctx.layout,
            task=task,
            run_config={},
            **extra,
        ),
        "source": source,
    }
    tokenizer = [
        hf_dir / f
        for f in (
            "vocab.txt",
            "tokenizer.json",
            "tokenizer_config.json",
            "special_tokens_map.json",
            "tokenizer.model",
        )
        if (hf_dir / f).is_file()
    ]
    return store.save(
        out_root / store.CHECKPOINTS,
        0,
        {"engine": engine},
        ctx,
        meta=meta,
        keep_last=0,
        tokenizer_files=tokenizer,
    )


def load_causal_lm(init: Path, ctx: ParallelContext) -> tuple[GPTForCausalLM, Path, list[int]]:
    """GPTForCausalLM at ctx's layout from a tpformer GPT checkpoint or a Hugging Face GPT-2
    directory; returns it, where its tokenizer would be, and its end-of-text ids (a HF
    config's eos_token_id; tpformer's corpora have none)."""
    source = require_arch(read_model_source(init, "init"), Arch.gpt, "init", "generation")
    if source.kind == CHECKPOINT:
        model = load_checkpoint_model(source.path, ctx)
        return cast(GPTForCausalLM, model), source.tokenizer_dir, []
    hf = read_hf_config(source.path)
    model = load_hf_model(source.path, ctx, task="causal_lm")
    eos = hf.get("eos_token_id")
    vocab = model.config.vocab_size
    return (
        cast(GPTForCausalLM, model),
        source.path,
        [eos] if isinstance(eos, int) and eos < vocab else [],
    )


def load_classifier(
    init: Path,
    ctx: ParallelContext,
    *,
    num_labels: int,
    overrides: dict[str, Any] | None = None,
) -> tuple[BertForSequenceClassification, Path]:
    """BertForSequenceClassification at ctx's layout from a tpformer checkpoint (its encoder and
    pooler; the classifier is freshly initialized) or a Hugging Face BERT directory, with
    `overrides` (model keys that shape no parameter, such as dropout) over its config. Returns
    the model and its tokenizer location (the checkpoint's tokenizer/ or the HF directory)."""
    source = require_arch(read_model_source(init, "init"), Arch.bert, "init", "fine-tuning")
    config = replace(source.config, **(overrides or {}))
    if source.kind == CHECKPOINT:
        model = cast(
            BertForSequenceClassification,
            build_model(config, ctx, task="classification", num_labels=num_labels),
        )
        encoder = [(f"bert.{n}", p) for n, p in model.bert.named_parameters()]
        template = {"engine": parameter_template(encoder)}
        store.load(source.path, template)
        model.bert.load_full_state_dict(
            {n.removeprefix("bert."): template["engine"][f"param/{n}"] for n, _ in encoder}
        )
        return model, source.tokenizer_dir
    classifier = load_hf_model(
        source.path, ctx, task="classification", num_labels=num_labels, overrides=overrides
    )
    return cast(BertForSequenceClassification, classifier), source.path
