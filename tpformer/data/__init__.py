"""Data: corpus readers, tokenizers, memory-mapped token files and pretraining samples keyed by
global index, so the order never depends on the layout."""

from __future__ import annotations

from pathlib import Path

from tpformer.config.derive import pair_recipe
from tpformer.config.schema import BlendPart, CorpusConfig, DataConfig, ModelConfig
from tpformer.data.blend import BlendedSamples, SampleSource
from tpformer.data.causal_lm import CausalLMDataset
from tpformer.data.corpus import CorpusSpec
from tpformer.data.indexed import IndexedCorpus, TokenCorpus
from tpformer.data.megatron_indexed import MegatronCorpus, is_megatron
from tpformer.data.preprocess import Ranks, cache_dir, prepare_tokenizer, preprocess
from tpformer.data.pretraining import BertPretrainingDataset
from tpformer.data.synthetic import SyntheticPretraining
from tpformer.data.tokenizer import Tokenizer
from tpformer.parallel.random import derive_seed

_PART = 0xB1E1


def corpus_spec(corpus: CorpusConfig) -> CorpusSpec:
    return CorpusSpec(
        source=corpus.source,
        paths=tuple(corpus.paths),
        documents=corpus.documents,
        name=corpus.name,
        config=corpus.config,
        split=corpus.split,
        text_field=corpus.text_field,
    )


def corpus_parts(data: DataConfig) -> list[CorpusConfig]:
    """The corpora of a run: data.blend's, or data.source's one."""
    return list(data.blend) or [data]


def blend_label(part: CorpusConfig, index: int) -> str:
    """A corpus's name in the per-corpus evaluation: its label, else its file or dataset."""
    if isinstance(part, BlendPart) and part.label:
        return part.label
    if part.paths:
        return Path(part.paths[0]).name.split(".")[0] or f"corpus{index}"
    return part.name or str(part.source)


def open_corpus(prefix: Path) -> TokenCorpus:
    """The token files at prefix: a Megatron-LM indexed dataset or tpformer's own."""
    return MegatronCorpus(prefix) if is_megatron(prefix) else IndexedCorpus(prefix)


def _token_files(
    part: CorpusConfig,
    tokenizer: Tokenizer,
    cache: Path,
    workers: int,
    progress: bool,
    ranks: Ranks,
) -> Path:
    if part.source == "megatron":
        if len(part.paths) != 1:
            raise ValueError(
                f"data.source=megatron reads one dataset prefix, got paths {list(part.paths)}; "
                "blend several with data.blend"
            )
        return MegatronCorpus(part.paths[0]).prefix
    spec = corpus_spec(part)
    corpus = preprocess(
        spec, tokenizer, cache=cache, workers=workers, progress=progress, ranks=ranks
    )
    return corpus.prefix


def prepare_data(
    data: DataConfig,
    vocab_size: int,
    *,
    progress: bool = True,
    ranks: Ranks = Ranks(),  # noqa: B008 - frozen, shared safely
) -> tuple[Path, tuple[Path, ...]]:
    """Tokenizer and token files for data (trained/tokenized once, then cached; Megatron
    datasets are read in place): returns (tokenizer path, one corpus prefix per corpus of the
    blend). Run by one process (a training run's rank 0), or by all `ranks` of a torchrun
    preprocessing: rank 0 trains the tokenizer, all tokenize their share of the shards."""
    parts = corpus_parts(data)
    cache = cache_dir(data.cache_dir)
    specs = [corpus_spec(p) for p in parts]

    def tokenizer_of(shown: bool) -> Tokenizer:
        return prepare_tokenizer(
            specs,
            tokenizer=data.tokenizer,
            vocab_size=vocab_size,
            model_type=data.tokenizer_type,
            cache=cache,
            progress=shown,
        )

    # trained (or found) by rank 0; the other ranks load it
    tokenizer = tokenizer_of(progress) if ranks.rank == 0 else None
    ranks.barrier()
    tokenizer = tokenizer or tokenizer_of(False)
    tokenizer.check_vocab(vocab_size)
    prefixes = tuple(
        _token_files(p, tokenizer, cache, data.workers, progress, ranks) for p in parts
    )
    return tokenizer.path, prefixes


def _corpus_samples(
    corpus: TokenCorpus, tokenizer: Tokenizer, data: DataConfig, model: ModelConfig, seed: int
) -> BertPretrainingDataset | CausalLMDataset:
    corpus.check_token_ids(model.vocab_size)
    if model.arch == "gpt":
        documents = corpus.adds_document_tokens
        return CausalLMDataset(
            corpus,
            seq_length=data.seq_length,
            seed=seed,
            eval_fraction=data.eval_fraction,
            bos=tokenizer.bos_id if documents else None,
            eos=tokenizer.eos_id if documents else None,
            pack=data.pack,
        )
    return BertPretrainingDataset(
        corpus,
        tokenizer,
        seq_length=data.seq_length,
        mask_prob=data.mask_prob,
        whole_word=data.whole_word_mask,
        sentence_pairs=pair_recipe(model, data),
        seed=seed,
        eval_fraction=data.eval_fraction,
        short_seq_prob=data.short_seq_prob,
        max_predictions=data.max_predictions_per_seq,
        pack=data.pack,
    )


def load_pretraining_data(
    data: DataConfig,
    model: ModelConfig,
    *,
    seed: int,
    prepared: tuple[Path, tuple[Path, ...]] | None,
) -> SampleSource:
    """The sample source of a pretraining run: synthetic, the prepared corpus, or the blend of
    the prepared corpora (each with its own seed)."""
    if data.source == "synthetic" and not data.blend:
        return SyntheticPretraining(
            arch=model.arch,
            vocab_size=model.vocab_size,
            seq_length=data.seq_length,
            mask_prob=data.mask_prob,
            seed=seed,
        )
    assert prepared is not None, "prepare_data() first"
    tokenizer = Tokenizer(prepared[0])
    corpora = [open_corpus(prefix) for prefix in prepared[1]]
    if not data.blend:
        return _corpus_samples(corpora[0], tokenizer, data, model, seed)
    parts = [
        _corpus_samples(c, tokenizer, data, model, derive_seed(seed, k, _PART))
        for k, c in enumerate(corpora)
    ]
    labels = [blend_label(p, k) for k, p in enumerate(data.blend)]
    return BlendedSamples(parts, [p.weight for p in data.blend], labels, seed)
