"""Data: corpus readers, tokenizers, memory-mapped token files and pretraining samples keyed by
global index, so the order never depends on the layout."""

from __future__ import annotations

from pathlib import Path

from tpformer.config.schema import DataConfig, ModelConfig
from tpformer.data.corpus import CorpusSpec
from tpformer.data.indexed import IndexedCorpus
from tpformer.data.preprocess import cache_dir, prepare_tokenizer, preprocess
from tpformer.data.pretraining import BertPretrainingDataset, CausalLMDataset
from tpformer.data.synthetic import SyntheticPretraining
from tpformer.data.tokenizer import Tokenizer


def corpus_spec(data: DataConfig) -> CorpusSpec:
    return CorpusSpec(
        source=data.source,
        paths=tuple(data.paths),
        name=data.name,
        config=data.config,
        split=data.split,
        text_field=data.text_field,
    )


def prepare_data(data: DataConfig, vocab_size: int, *, progress: bool = True) -> tuple[Path, Path]:
    """Tokenizer and preprocessed corpus for data (trained/tokenized once, then cached):
    returns (tokenizer path, corpus prefix). Run by one process; the others load the result."""
    spec = corpus_spec(data)
    cache = cache_dir(data.cache_dir)
    tokenizer = prepare_tokenizer(
        spec,
        tokenizer=data.tokenizer,
        vocab_size=vocab_size,
        model_type=data.tokenizer_type,
        cache=cache,
        progress=progress,
    )
    tokenizer.check_vocab(vocab_size)
    corpus = preprocess(spec, tokenizer, cache=cache, workers=data.workers, progress=progress)
    return tokenizer.path, corpus.prefix


def load_pretraining_data(
    data: DataConfig, model: ModelConfig, *, seed: int, prepared: tuple[Path, Path] | None
):
    """The sample source of a pretraining run: synthetic, or the prepared corpus."""
    if data.source == "synthetic":
        return SyntheticPretraining(
            arch=model.arch,
            vocab_size=model.vocab_size,
            seq_length=data.seq_length,
            mask_prob=data.mask_prob,
            seed=seed,
        )
    assert prepared is not None, "prepare_data() first"
    tokenizer, corpus = Tokenizer(prepared[0]), IndexedCorpus(prepared[1])
    corpus.check_token_ids(model.vocab_size)
    if model.arch == "gpt":
        return CausalLMDataset(
            corpus,
            seq_length=data.seq_length,
            seed=seed,
            eval_fraction=data.eval_fraction,
            bos=tokenizer.bos_id,
            eos=tokenizer.eos_id,
        )
    return BertPretrainingDataset(
        corpus,
        tokenizer,
        seq_length=data.seq_length,
        mask_prob=data.mask_prob,
        whole_word=data.whole_word_mask,
        sentence_pairs=data.sentence_pairs,
        seed=seed,
        eval_fraction=data.eval_fraction,
    )
