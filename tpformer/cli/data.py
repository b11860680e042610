"""`tpformer-tokenizer` and `tpformer-preprocess` (tools/train_tokenizer.py and
tools/preprocess_data.py are aliases): the data steps of a pretraining run, on their own, with
the same Hydra overrides as `tpformer-pretrain`, so the run that follows finds their output in
the cache.

    tpformer-tokenizer data=text data.paths=[corpus.txt] model.vocab_size=8000 [--out DIR]
    tpformer-preprocess data=text data.paths=[corpus.txt] model.vocab_size=8000 data.workers=8
    torchrun --nnodes 4 --nproc_per_node 1 ... --no-python tpformer-preprocess <same overrides>

Under torchrun each rank tokenizes its share of the corpus's shards with data.workers processes
(data.cache_dir on a shared file system) and rank 0 joins them; a killed preprocessing, rerun,
continues from its finished shards.
"""

from __future__ import annotations

import argparse
import logging
from datetime import timedelta
from pathlib import Path

from tpformer.cli.shell import console_script
from tpformer.config.overrides import compose_typed
from tpformer.config.rules.data import validate_data
from tpformer.config.schema import Config
from tpformer.data.preprocess import Ranks


def _config(overrides: list[str]) -> Config:
    config: Config = compose_typed("config", Config, overrides)
    validate_data(config.data)
    if config.data.source == "synthetic":
        raise ValueError(
            "data.source=synthetic needs no tokenizer or preprocessing; pick a corpus "
            "(data=shakespeare, data=text data.paths=[...], data=jsonl, data=hf)"
        )
    return config


def _setup_logging() -> None:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")


@console_script
def train_tokenizer_main(argv: list[str] | None = None) -> None:
    """Train the sentencepiece model a run with these overrides would use."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, help="write tokenizer.model here instead of the cache")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, as for tpformer-pretrain")
    args = parser.parse_args(argv)
    _setup_logging()
    from tpformer.data import corpus_parts, corpus_spec
    from tpformer.data.preprocess import cache_dir, corpus_sentences, prepare_tokenizer
    from tpformer.data.tokenizer import train_sentencepiece

    config = _config(args.overrides)
    data = config.data
    specs = [corpus_spec(part) for part in corpus_parts(data)]
    if args.out:
        path = train_sentencepiece(
            corpus_sentences(specs),
            args.out,
            vocab_size=config.model.vocab_size,
            model_type=data.tokenizer_type,
        )
    else:
        path = prepare_tokenizer(
            specs,
            tokenizer=data.tokenizer,
            vocab_size=config.model.vocab_size,
            model_type=data.tokenizer_type,
            cache=cache_dir(data.cache_dir),
        ).path
    print(path)


@console_script
def preprocess_main(argv: list[str] | None = None) -> None:
    """Tokenizer (trained if needed) and the memory-mapped corpus a run would use."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, as for tpformer-pretrain")
    args = parser.parse_args(argv)
    _setup_logging()
    from tpformer.data import prepare_data

    config = _config(args.overrides)
    ranks = _torchrun_ranks()
    tokenizer, corpora = prepare_data(config.data, config.model.vocab_size, ranks=ranks)
    if ranks.rank == 0:
        print(f"tokenizer {tokenizer}")
        for corpus in corpora:
            print(f"corpus {corpus}")


def _torchrun_ranks() -> Ranks:
    """The ranks of a torchrun preprocessing (a day's patience for the slowest rank's shards);
    one process otherwise."""
    from tpformer.parallel.host_ranks import host_ranks

    return Ranks(*host_ranks(timedelta(hours=24)))
