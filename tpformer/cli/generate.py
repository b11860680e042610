"""`tpformer-generate`: completions from a GPT checkpoint or a Hugging Face GPT-2 directory.

tpformer-generate init=runs/gpt/checkpoints/step00000300 prompt="To be, or not to be"
tpformer-generate init=hf/gpt2 prompts=prompts.txt sampling=sample temperature=0.8 top_p=0.9
        parallel.tensor=2 launcher.nproc_per_node=2

Any TP degree (heads and KV cache split over the TP group); DP ranks take whole batches of
prompts; no pipeline (each TP group holds the whole model).
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

import hydra
import torch
from omegaconf import DictConfig

from tpformer.cli.inputs import prepare_generate
from tpformer.cli.shell import console_script, run_entry_point
from tpformer.config.overrides import checked_overrides
from tpformer.config.rules.choices import check_choices
from tpformer.config.schema import GenerateConfig, ParallelConfig
from tpformer.config.store import CONF_DIR, register_configs
from tpformer.inference.generation import GenerationSettings, generate
from tpformer.inference.sampling import Sampling
from tpformer.inference.text import TextCodec, continuation, encode, load_codec, read_prompts
from tpformer.parallel.comm import all_gather_object
from tpformer.parallel.context import ParallelContext
from tpformer.parallel.layout import Layout
from tpformer.progress import progress

log = logging.getLogger("tpformer")
register_configs()


def validate_layout_for_inference(parallel: ParallelConfig, layout: Layout) -> None:
    """Inference keeps the whole model in each TP group and the whole sequence on each rank."""
    if layout.pp > 1:
        raise ValueError(
            f"parallel.pipeline={layout.pp}: generation and evaluation keep the whole model in "
            "each TP group (parallel.pipeline=1); use parallel.tensor to split it"
        )
    if parallel.sequence_parallel:
        raise ValueError(
            "parallel.sequence_parallel=true: decoding runs one token per step, which the TP "
            "group cannot split; set it to false"
        )
    if layout.cp > 1:
        raise ValueError(
            f"parallel.context={layout.cp}: generation and evaluation keep the whole sequence on "
            "each rank (a KV cache is not split over a CP ring); use parallel.context=1"
        )


def validate_generate(config: GenerateConfig, layout: Layout, *, device_type: str = "cpu") -> None:
    """The rules of a generation run, before any process group exists."""
    check_choices(config)
    if bool(config.prompt) == bool(config.prompts):
        raise ValueError(
            "give one of prompt=<text> (one prompt) or prompts=<file> (text lines or JSONL)"
        )
    validate_layout_for_inference(config.parallel, layout)


def _sampling(config: GenerateConfig) -> Sampling:
    return Sampling(
        greedy=config.sampling == "greedy",
        temperature=config.temperature,
        top_k=config.top_k,
        top_p=config.top_p,
    )


def _cut(text: str, stops: list[str]) -> str:
    """The text before the first stop string."""
    ends = [text.find(s) for s in stops if s in text]
    return text[: min(ends)] if ends else text


def _record(
    index: int,
    prompt: tuple[str, list[int]],
    ids: list[int],
    stop_ids: frozenset[int],
    codec: TextCodec | None,
    stops: list[str],
) -> dict:
    text_ids = ids[:-1] if ids and ids[-1] in stop_ids else ids
    text = _cut(continuation(codec, prompt[1], text_ids), stops) if codec is not None else ""
    return {"index": index, "prompt": prompt[0], "text": text, "output_ids": ids}


class _Stream:
    """Prints a single prompt's completion to the console as its tokens arrive (ids when there
    is no tokenizer), up to a stop token. Text that ends inside a character (a byte-level token
    holding part of it decodes to U+FFFD) waits for the tokens that complete it."""

    def __init__(
        self, codec: TextCodec | None, prompt: tuple[str, list[int]], stop_ids: frozenset[int]
    ) -> None:
        self.codec, self.prompt, self.stop_ids = codec, prompt[1], stop_ids
        self.ids: list[int] = []
        self.shown, self.stopped = "", False
        print(prompt[0], end="", flush=True)

    def __call__(self, tokens: list[int]) -> None:
        if self.stopped or tokens[0] in self.stop_ids:
            self.stopped = True
            return
        self.ids.append(tokens[0])
        if self.codec is None:
            print(f" {tokens[0]}", end="", flush=True)
            return
        text = continuation(self.codec, self.prompt, self.ids)
        if not text.endswith("\ufffd"):
            self._show(text)

    def finish(self, text: str) -> None:
        """The completion as written to the output (stop strings cut): what is left of it."""
        if self.codec is not None:
            self._show(text)
        print(flush=True)

    def _show(self, text: str) -> None:
        if text.startswith(self.shown):
            print(text[len(self.shown) :], end="", flush=True)
            self.shown = text


def _write_completions(
    config: GenerateConfig,
    prompts: list[tuple[str, list[int]]],
    done: dict[int, list[int]],
    stop_ids: frozenset[int],
    codec: TextCodec | None,
    stream: _Stream | None,
    run_dir: Path,
    start: float,
) -> None:
    """One JSON line per prompt (in prompt order) to generate.output, and the throughput."""
    output = Path(config.output) if config.output else run_dir / "completions.jsonl"
    output.parent.mkdir(parents=True, exist_ok=True)
    with output.open("w") as out_file:
        for i, prompt in enumerate(prompts):
            record = _record(i, prompt, done[i], stop_ids, codec, list(config.stop))
            out_file.write(json.dumps(record) + "\n")
            if stream is not None:
                stream.finish(record["text"])
    tokens = sum(len(ids) for ids in done.values())
    seconds = time.perf_counter() - start
    log.info(
        "done: %d completions, %d new tokens in %.1f s (%.0f tokens/s with loading); %s",
        len(prompts),
        tokens,
        seconds,
        tokens / seconds,
        output,
    )


def generate_job(config: GenerateConfig, ctx: ParallelContext, run_dir: Path) -> None:
    from tpformer.convert import load_causal_lm  # the model stack: after validation

    start = time.perf_counter()
    model, tokenizer_dir, eos = load_causal_lm(Path(config.init), ctx)
    if config.parallel.precision != "fp32":  # fp8 generates in bf16 (fp8 is a training mode)
        model.to(torch.float16 if config.parallel.precision == "fp16" else torch.bfloat16)
    model.eval()
    codec = load_codec(tokenizer_dir)
    if config.stop and codec is None:
        raise ValueError("stop strings need a tokenizer, and the model directory has none")
    prompts = (
        [(config.prompt, encode(config.prompt, codec, "prompt", "prompts"))]
        if config.prompt
        else read_prompts(Path(config.prompts), codec)
    )
    stop_ids = frozenset([*config.stop_tokens, *eos])
    settings = GenerationSettings(config.max_new_tokens, _sampling(config), stop_ids)
    stop = None
    if config.stop and codec is not None:
        stops = list(config.stop)
        stop = lambda row, ids: any(s in codec.decode(ids) for s in stops)  # noqa: E731
    batches = [
        list(range(i, min(i + config.batch_size, len(prompts))))
        for i in range(0, len(prompts), config.batch_size)
    ]
    streaming = len(prompts) == 1 and ctx.is_main
    bar = progress(
        total=len(prompts), desc="generate", unit=" prompts", enabled=ctx.is_main and not streaming
    )
    mine: dict[int, list[int]] = {}
    stream = _Stream(codec, prompts[0], stop_ids) if streaming else None
    for number in range(ctx.dp.rank, len(batches), ctx.dp.size):
        batch = batches[number]
        generator = torch.Generator(device=ctx.device).manual_seed(config.seed + number)
        out = generate(
            model,
            [prompts[i][1] for i in batch],
            settings,
            generator,
            stop=stop,
            on_tokens=stream,
        )
        mine.update(zip(batch, out))
        bar.update(len(batch) * ctx.dp.size)
    bar.close()
    done: dict[int, list[int]] = {}
    for part in all_gather_object(mine, ctx.dp):
        done.update(part)
    if not ctx.is_main:
        return
    _write_completions(config, prompts, done, stop_ids, codec, stream, run_dir, start)


@console_script
@checked_overrides(GenerateConfig, "tpformer-generate", __doc__ or "", "generate")
@hydra.main(version_base=None, config_path=CONF_DIR, config_name="generate")
def main(cfg: DictConfig) -> None:
    run_entry_point(
        cfg,
        "tpformer.cli.generate",
        generate_job,
        check=validate_generate,
        prepare=prepare_generate,
    )


if __name__ == "__main__":
    main()
