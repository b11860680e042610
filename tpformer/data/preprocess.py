"""Corpus -> tokenizer -> memory-mapped tokens, cached by content hash.

    tokenizer:  data.tokenizer, or a sentencepiece model of model.vocab_size trained on the
                corpus into <cache>/tokenizer-<hash>/ (hash of corpus, vocab size, type)
    tokens:     <cache>/corpus-<hash>.{bin,sentences.npy,documents.npy,json} (hash of corpus
                and tokenizer)

Rerunning on the same input finds the files and skips the work. Tokenization cuts the corpus into
shards that a pool of worker processes (and the ranks of a torchrun preprocessing) tokenize
independently, with a progress bar in bytes and tokens per second; a killed run continues from
its finished shards.
"""

from __future__ import annotations

import hashlib
import json
import logging
import multiprocessing
import os
import shutil
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tpformer.data.corpus import CorpusSpec, fingerprint, read_documents, split_sentences
from tpformer.data.indexed import IndexedCorpus, IndexedWriter
from tpformer.data.shards import SHARD_BYTES, Shard, plan_shards, shard_documents
from tpformer.data.tokenizer import SP_FILE, Tokenizer, train_sentencepiece
from tpformer.progress import progress as progress_display

log = logging.getLogger(__name__)
FORMAT = "tpformer-indexed-2"
"""2: the index as streamed .npy files (1: one .idx.npz written at the end, held in memory)."""
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
    """One tokenizing thread per worker process: the workers are the parallelism."""
    global _worker_tokenizer
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    _worker_tokenizer = Tokenizer(Path(tokenizer_path))
    _worker_tokenizer.threads = 1


def tokenize_shard(shard: Shard, tokenizer: Tokenizer, out: Path, batch: int = 1 << 20) -> int:
    """A shard's documents, sentence-split and encoded about `batch` characters per call, into
    the token files at `out` (complete only when finished); returns its token count."""
    writer = IndexedWriter(out, tokenizer.vocab_size)
    documents: list[str] = []
    size = 0
    try:
        for document in shard_documents(shard):
            documents.append(document)
            size += len(document)
            if size >= batch:
                writer.add_batch(tokenizer.encode_corpus(documents))
                documents, size = [], 0
        writer.add_batch(tokenizer.encode_corpus(documents))
        writer.finish({"format": FORMAT, "shard": shard.to_json()})
    except BaseException:
        writer.abort()
        raise
    return writer.num_tokens


def _tokenize_task(task: tuple[int, dict, str]) -> tuple[int, int]:
    k, shard, out = task
    assert _worker_tokenizer is not None
    return k, tokenize_shard(Shard.from_json(shard), _worker_tokenizer, Path(out))


@dataclass(frozen=True)
class Ranks:
    """The processes preprocessing together (a torchrun preprocessing; one by default)."""

    rank: int = 0
    world: int = 1
    barrier: Callable[[], None] = lambda: None


def _shard_plan(spec: CorpusSpec, shard_dir: Path, shard_bytes: int, ranks: Ranks) -> list[Shard]:
    """The shards, planned once by rank 0 and kept with them (a resumed run reuses the plan)."""
    plan_file = shard_dir / "plan.json"
    if ranks.rank == 0 and not plan_file.is_file():
        shard_dir.mkdir(parents=True, exist_ok=True)
        rows = [shard.to_json() for shard in plan_shards(spec, shard_bytes)]
        Path(f"{plan_file}.tmp").write_text(json.dumps(rows))
        os.replace(f"{plan_file}.tmp", plan_file)
    ranks.barrier()
    return [Shard.from_json(row) for row in json.loads(plan_file.read_text())]


def _run_shards(
    tasks: list[tuple[int, dict, str]],
    plan: list[Shard],
    tokenizer: Tokenizer,
    workers: int,
    bar: Any,
) -> None:
    started, tokens, done = time.monotonic(), 0, 0

    def finished(k: int, count: int) -> None:
        nonlocal tokens, done
        tokens, done = tokens + count, done + plan[k].size
        elapsed = max(time.monotonic() - started, 1e-9)
        bar.update(-(-plan[k].size // 1000) or 1)
        bar.set_postfix(
            MB_s=f"{done / elapsed / 1e6:.2f}", tokens_s=f"{tokens / elapsed:,.0f}", refresh=False
        )

    if workers > 1 and len(tasks) > 1:
        context = multiprocessing.get_context("spawn")
        with context.Pool(
            min(workers, len(tasks)), initializer=_init_worker, initargs=(str(tokenizer.path),)
        ) as pool:
            for k, count in pool.imap_unordered(_tokenize_task, tasks):
                finished(k, count)
    else:  # in this process, one tokenizing thread as a worker has
        threads, tokenizer.threads = tokenizer.threads, 1
        try:
            for k, shard, out in tasks:
                finished(k, tokenize_shard(Shard.from_json(shard), tokenizer, Path(out)))
        finally:
            tokenizer.threads = threads


def preprocess(
    spec: CorpusSpec,
    tokenizer: Tokenizer,
    *,
    cache: Path,
    workers: int = 2,
    progress: bool = True,
    shard_bytes: int = SHARD_BYTES,
    ranks: Ranks = Ranks(),
) -> IndexedCorpus:
    """Tokenize the corpus into <cache>/corpus-<hash>.*, or reuse the files of an earlier run.

    The corpus is cut into shards (data/shards.py), each tokenized into
    <cache>/corpus-<hash>.shards/<k>.* by `workers` processes of each of the `ranks`; a killed
    run keeps its finished shards and a rerun continues from them; rank 0 joins them into one
    token file and index."""
    prefix = cache / f"corpus-{_key(FORMAT, fingerprint(spec), tokenizer.fingerprint())}"
    if Path(f"{prefix}.json").is_file():
        log.info("corpus: reusing %s (same content hash)", prefix)
        return IndexedCorpus(prefix)
    shard_dir = Path(f"{prefix}.shards")
    plan = _shard_plan(spec, shard_dir, shard_bytes, ranks)
    outs = [shard_dir / f"{k:05d}" for k in range(len(plan))]
    mine = [k for k in range(len(plan)) if k % ranks.world == ranks.rank]
    todo = [k for k in mine if not Path(f"{outs[k]}.json").is_file()]
    if len(todo) < len(mine):
        log.info(
            "corpus: %d of %d shards already done, continuing", len(mine) - len(todo), len(mine)
        )
    total = sum(-(-plan[k].size // 1000) for k in todo) or len(todo)
    bar = progress_display(desc="preprocess", unit=" kB", total=total, enabled=progress)
    tasks = [(k, plan[k].to_json(), str(outs[k])) for k in todo]
    _run_shards(tasks, plan, tokenizer, workers, bar)
    bar.close()
    ranks.barrier()
    if ranks.rank == 0:
        _join(outs, prefix, spec, tokenizer)
        shutil.rmtree(shard_dir, ignore_errors=True)
    ranks.barrier()
    return IndexedCorpus(prefix)


def _join(parts: list[Path], prefix: Path, spec: CorpusSpec, tokenizer: Tokenizer) -> None:
    writer = IndexedWriter(prefix, tokenizer.vocab_size)
    try:
        for part in parts:
            writer.add_corpus(IndexedCorpus(part))
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
                "shards": len(parts),
            }
        )
    except BaseException:
        writer.abort()
        raise
    log.info(
        "corpus: %d documents, %d tokens in %d shards -> %s",
        writer.num_documents,
        writer.num_tokens,
        len(parts),
        prefix,
    )
