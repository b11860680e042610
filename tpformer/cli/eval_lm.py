"""`tpformer-eval-lm`: loss and perplexity of a causal LM on a text file, sliding window.

tpformer-eval-lm init=runs/gpt/checkpoints/step00000300 data_file=valid.txt seq_length=512
        stride=256
tpformer-eval-lm init=hf/gpt2 data_file=valid.jsonl parallel.tensor=2 launcher.nproc_per_node=2
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import hydra
import torch
from omegaconf import DictConfig

from tpformer.cli.generate import validate_layout_for_inference
from tpformer.cli.inputs import prepare_eval_lm
from tpformer.cli.shell import console_script, run_entry_point
from tpformer.config.overrides import checked_overrides
from tpformer.config.rules.choices import check_choices
from tpformer.config.schema import EvalLMConfig
from tpformer.config.store import CONF_DIR, register_configs
from tpformer.inference.perplexity import perplexity
from tpformer.inference.text import load_codec, read_token_stream
from tpformer.parallel.context import ParallelContext
from tpformer.parallel.layout import Layout

log = logging.getLogger("tpformer")
register_configs()


def validate_eval_lm(config: EvalLMConfig, layout: Layout, *, device_type: str = "cpu") -> None:
    check_choices(config)
    validate_layout_for_inference(config.parallel, layout)
    if config.stride > config.seq_length > 0:
        raise ValueError(
            f"stride={config.stride} exceeds seq_length={config.seq_length}: tokens between "
            "windows would not be scored"
        )


def eval_lm_job(config: EvalLMConfig, ctx: ParallelContext, run_dir: Path) -> None:
    from tpformer.convert import load_causal_lm  # the model stack: after validation

    start = time.perf_counter()
    model, tokenizer_dir, _ = load_causal_lm(Path(config.init), ctx)
    model.eval()
    stream = torch.tensor(
        read_token_stream(Path(config.data_file), load_codec(tokenizer_dir)), dtype=torch.long
    )
    limit = model.config.max_position_embeddings
    seq = config.seq_length or limit
    if seq > limit:
        raise ValueError(f"seq_length={seq} exceeds the model's max_position_embeddings={limit}")
    if int(stream.max()) >= model.config.vocab_size:
        raise ValueError(
            f"data_file={config.data_file} holds token id {int(stream.max())}, outside the model's "
            f"vocabulary of {model.config.vocab_size}"
        )
    result = perplexity(
        model,
        stream,
        ctx,
        seq_length=seq,
        stride=config.stride or seq,
        batch_size=config.batch_size,
    )
    if ctx.is_main:
        record = {
            "init": config.init,
            "data_file": config.data_file,
            "seq_length": seq,
            "stride": config.stride or seq,
            "tokens": len(stream),
            "scored_tokens": result.tokens,
            "windows": result.windows,
            "loss": result.loss,
            "perplexity": result.perplexity,
            "seconds": time.perf_counter() - start,
        }
        (run_dir / "eval_lm.json").write_text(json.dumps(record, indent=1))
        log.info(
            "loss %.4f, perplexity %.3f over %d tokens (%d windows of %d, stride %d); %s",
            result.loss,
            result.perplexity,
            result.tokens,
            result.windows,
            seq,
            config.stride or seq,
            run_dir / "eval_lm.json",
        )


@console_script
@checked_overrides(EvalLMConfig, "tpformer-eval-lm", __doc__ or "", "eval_lm")
@hydra.main(version_base=None, config_path=CONF_DIR, config_name="eval_lm")
def main(cfg: DictConfig) -> None:
    run_entry_point(
        cfg, "tpformer.cli.eval_lm", eval_lm_job, check=validate_eval_lm, prepare=prepare_eval_lm
    )


if __name__ == "__main__":
    main()
