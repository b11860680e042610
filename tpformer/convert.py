"""Between tpformer checkpoints and Hugging Face directories, in one process.

to_hf:   the logical parameters of a checkpoint -> the tpformer model -> save_pretrained.
from_hf: a HF directory -> the tpformer model -> a step-0 checkpoint (fresh optimizer state)
         that `trainer.resume=<dir>` continues from at any layout.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from tpformer.checkpoint import store
from tpformer.config.schema import Config, ModelConfig, OptimConfig, ParallelConfig
from tpformer.engine import build_engine
from tpformer.models import build_model
from tpformer.models.hf import load_hf_model, save_hf_checkpoint
from tpformer.parallel.context import ParallelContext
from tpformer.engine.state import parameter_template

TASK = {"bert": "pretraining", "gpt": "causal_lm"}


def checkpoint_model_config(directory: Path) -> ModelConfig:
    meta = store.read_meta(directory)
    if "config" not in meta:
        raise ValueError(f"{directory}/meta.json has no resolved config; re-save it with this tpformer")
    return ModelConfig(**meta["config"]["model"])  # type: ignore[index]


def to_hf(checkpoint: Path, out: Path) -> Path:
    """Write the checkpoint's model as a HF directory (BertForPreTraining or GPT2LMHeadModel)."""
    config = checkpoint_model_config(checkpoint)
    ctx = ParallelContext.single(device="cpu")
    model = build_model(config, ctx, task=TASK[config.arch], initialize=False)
    params = dict(model.named_parameters())
    template = {"engine": parameter_template(list(params.items()))}
    store.load(checkpoint, template)
    model.load_full_state_dict({n: template["engine"][f"param/{n}"] for n in params})
    save_hf_checkpoint(model, ctx, out)
    tokenizer = checkpoint / store.TOKENIZER_DIR
    store.copy_tokenizer(sorted(tokenizer.iterdir()) if tokenizer.is_dir() else [], out)
    return out


def from_hf(hf_dir: Path, out_root: Path) -> Path:
    """A step-0 tpformer checkpoint under out_root/checkpoints with the HF weights."""
    ctx = ParallelContext.single(device="cpu")
    model = load_hf_model(hf_dir, ctx, task=None)
    config = Config(model=model.config)  # type: ignore[arg-type]
    engine = build_engine(model, OptimConfig(), ParallelConfig(), ctx)
    state = {"engine": engine}
    meta = {**store.checkpoint_meta(config, ctx), "source": str(hf_dir)}
    tokenizer = [hf_dir / f for f in ("vocab.txt", "tokenizer.json", "tokenizer_config.json",
                                      "special_tokens_map.json", "tokenizer.model")
                 if (hf_dir / f).is_file()]
    return store.save(out_root / "checkpoints", 0, state, ctx, meta=meta, keep_last=0,
                      tokenizer_files=tokenizer)


def load_classifier(init: Path, ctx: ParallelContext, *, num_labels: int) -> tuple[nn.Module, Path]:
    """BertForSequenceClassification at ctx's layout from a tpformer checkpoint (its encoder and
    pooler; the classifier is freshly initialized) or a Hugging Face BERT directory. Returns the
    model and its tokenizer location (the checkpoint's tokenizer/ or the HF directory)."""
    init = Path(init).expanduser()
    if (init / store.META).is_file():
        config = checkpoint_model_config(init)
        if config.arch != "bert":
            raise ValueError(f"init={init} holds a {config.arch} model; fine-tuning needs BERT")
        model = build_model(config, ctx, task="classification", num_labels=num_labels)
        encoder = dict(model.bert.named_parameters())
        template = {"engine": parameter_template([(f"bert.{n}", p) for n, p in encoder.items()])}
        store.load(init, template)
        model.bert.load_full_state_dict({n: template["engine"][f"param/bert.{n}"] for n in encoder})
        return model, init / store.TOKENIZER_DIR
    if not (init / "config.json").is_file():
        raise FileNotFoundError(f"init={init} is neither a tpformer checkpoint (meta.json) nor a "
                                f"Hugging Face directory (config.json)")
    return load_hf_model(init, ctx, task="classification", num_labels=num_labels), init
