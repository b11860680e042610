"""Corpus -> tokenizer -> memory-mapped tokens, cached by content hash.

    tokenizer:  data.tokenizer, or a sentencepiece model of model.vocab_size trained on the
                corpus into <cache>/tokenizer-<hash>/ (hash of corpus, vocab size, type)
    tokens:     <cache>/corpus-<hash>.{bin,idx.npz,json} (hash of corpus and tokenizer)

Rerunning on the same input finds the files and skips the work. Tokenization streams documents
through a pool of worker processes, with a progress bar.
"""

from __future__ import annotations

import hashlib
import logging
import multiprocessing
from collections.abc import Iterator, Sequence
from pathlib import Path

from tpformer.data.corpus import CorpusSpec, fingerprint, read_documents, split_sentences
from tpformer.data.indexed import IndexedCorpus, IndexedWriter
from tpformer.data.tokenizer import SP_FILE, Tokenizer, train_sentencepiece
from tpformer.progress import progress as progress_display

log = logging.getLogger(__name__)
FORMAT = "tpformer-indexed-1"
_worker_tokenizer: Tokenizer | None = None


def cache_dir(path: str) -> Path:
    return Path(path).expanduser()


def _key(*parts: object) -> str:
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:16]


def corpus_sentences(specs: Sequence[CorpusSpec]) -> Iterator[str]:
    """The sentences of every corpus, one corpus after the other (a blend's tokenizer is
    trained on all of them)."""
    for spec in specs:
        for document in read_documents(spec):
            yield from split_sentences(document)


def _fingerprints(specs: Sequence[CorpusSpec]) -> str:
    prints = [fingerprint(s) for s in specs]
    return prints[0] if len(prints) == 1 else _key(*prints)  # one corpus: the earlier key


def prepare_tokenizer(
    specs: Sequence[CorpusSpec],
    *,
    tokenizer: str,
    vocab_size: int,
    model_type: str,
    cache: Path,
    progress: bool = True,
) -> Tokenizer:
    """data.tokenizer if given, else a sentencepiece model trained on the corpora (cached)."""
    if tokenizer:
        return Tokenizer(Path(tokenizer))
    out = cache / f"tokenizer-{_key(_fingerprints(specs), vocab_size, model_type)}"
    if (out / SP_FILE).is_file():
        log.info("tokenizer: reusing %s", out / SP_FILE)
        return Tokenizer(out / SP_FILE)
    log.info(
        "tokenizer: training a %s sentencepiece model of %d tokens on data.source=%s",
        model_type,
        vocab_size,
        "+".join(str(s.source) for s in specs),
    )
    sentences = progress_display(
        corpus_sentences(specs), desc="tokenizer: reading", unit=" sentences", enabled=progress
    )
    counted = _nonempty(sentences, specs[0])
    return Tokenizer(
        train_sentencepiece(counted, out, vocab_size=vocab_size, model_type=model_type)
    )


def _nonempty(sentences: Iterator[str], spec: CorpusSpec) -> Iterator[str]:
    any_seen = False
    for s in sentences:
        any_seen = True
        yield s
    if not any_seen:
        raise ValueError(
            f"the corpus (data.source={spec.source}, paths {list(spec.paths)}) has no text"
        )


def _init_worker(tokenizer_path: str) -> None:
    global _worker_tokenizer
    _worker_tokenizer = Tokenizer(Path(tokenizer_path))


def _tokenize(document: str) -> list[list[int]]:
    assert _worker_tokenizer is not None
    return _worker_tokenizer.encode(split_sentences(document))


def preprocess(
    spec: CorpusSpec, tokenizer: Tokenizer, *, cache: Path, workers: int = 2, progress: bool = True
) -> IndexedCorpus:
    """Tokenize the corpus into <cache>/corpus-<hash>.*, or reuse the files of an earlier run."""
    prefix = cache / f"corpus-{_key(FORMAT, fingerprint(spec), tokenizer.fingerprint())}"
    if Path(f"{prefix}.json").is_file():
        log.info("corpus: reusing %s (same content hash)", prefix)
        return IndexedCorpus(prefix)
    writer = IndexedWriter(prefix, tokenizer.vocab_size)
    documents = read_documents(spec)
    bar = progress_display(desc="preprocess", unit=" docs", enabled=progress)
    try:
        if workers > 1:
            context = multiprocessing.get_context("spawn")
            with context.Pool(
                workers, initializer=_init_worker, initargs=(str(tokenizer.path),)
            ) as pool:
                for sentences in pool.imap(_tokenize, documents, chunksize=4):
                    writer.add(sentences)
                    bar.update(1)
                    # shown with the next update, not drawn per document
                    bar.set_postfix(tokens=writer.num_tokens, refresh=False)
        else:
            for document in documents:
                writer.add(tokenizer.encode(split_sentences(document)))
                bar.update(1)
        bar.close()
        if writer.num_documents == 0:
            raise ValueError(
                f"the corpus (data.source={spec.source}, paths {list(spec.paths)}) has no text"
            )
        writer.finish(
            {
                "format": FORMAT,
                "source": spec.source,
                "paths": list(spec.paths),
                "tokenizer": str(tokenizer.path),
                "vocab_size": tokenizer.vocab_size,
            }
        )
    except BaseException:
        writer.abort()
        raise
    log.info(
        "corpus: %d documents, %d tokens -> %s", writer.num_documents, writer.num_tokens, prefix
    )
    return IndexedCorpus(prefix)
