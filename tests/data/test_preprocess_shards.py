"""Sharded preprocessing: whatever the shard size, worker count or number of torchrun ranks,
the token file holds the documents a one-piece tokenization gives, in order; a killed run,
rerun, tokenizes only the shards it had not finished."""

from __future__ import annotations

import importlib
import json
import random
from pathlib import Path

import pytest

from tests.data.common import corpus_tokenizer, write_corpus
from tests.dist import run_distributed
from tpformer.data.corpus import CorpusSpec, read_documents, split_sentences
from tpformer.data.indexed import IndexedCorpus
from tpformer.data.preprocess import Ranks, preprocess
from tpformer.data.shards import plan_shards
from tpformer.data.tokenizer import Tokenizer
from tpformer.parallel.context import ParallelContext

preprocessing = importlib.import_module(
    "tpformer.data.preprocess"
)  # the package's name is a function

SMALL = 2048
"""Bytes per shard in these tests: a few documents each."""


@pytest.fixture(scope="module")
def corpora(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Tokenizer]:
    root = tmp_path_factory.mktemp("shards")
    for i in range(3):
        write_corpus(root / f"part{i}.txt", documents=12, seed=i)
    parts = tuple(str(root / f"part{i}.txt") for i in range(3))
    lines = [json.dumps({"text": d}) for d in read_documents(CorpusSpec("text", parts))]
    (root / "part.jsonl").write_text("\n".join(lines) + "\n")
    return root, corpus_tokenizer(root / "part0.txt", root / "tok")


def _specs(root: Path) -> dict[str, CorpusSpec]:
    parts = tuple(str(root / f"part{i}.txt") for i in range(3))
    return {
        "paragraphs": CorpusSpec("text", parts),
        "lines": CorpusSpec("text", parts, documents="line"),
        "files": CorpusSpec("text", parts, documents="file"),
        "jsonl": CorpusSpec("jsonl", (str(root / "part.jsonl"),)),
    }


def _expected(spec: CorpusSpec, tok: Tokenizer) -> list[list[list[int]]]:
    """The one-piece tokenization: every document of the corpus, in order."""
    return [tok.encode(split_sentences(d)) for d in read_documents(spec)]


def _documents(corpus: IndexedCorpus) -> list[list[list[int]]]:
    return [[s.tolist() for s in corpus.document(d)] for d in range(corpus.num_documents)]


@pytest.mark.parametrize("kind", ["paragraphs", "lines", "files", "jsonl"])
@pytest.mark.parametrize("workers", [1, pytest.param(2, marks=pytest.mark.slow)])  # 2: ~5 s
def test_shards_join_into_the_corpus(
    corpora: tuple[Path, Tokenizer], tmp_path: Path, kind: str, workers: int
) -> None:
    root, tok = corpora
    spec = _specs(root)[kind]
    shards = plan_shards(spec, SMALL)
    assert len(shards) == 3 if kind == "files" else len(shards) > 6, len(shards)
    corpus = preprocess(
        spec, tok, cache=tmp_path, workers=workers, progress=False, shard_bytes=SMALL
    )
    assert _documents(corpus) == _expected(spec, tok)
    assert corpus.meta["shards"] == len(shards)
    assert not Path(f"{corpus.prefix}.shards").exists(), "the shards are removed once joined"


def _all_document_starts(path: Path, documents: str) -> list[int]:
    """Every document start, by reading every line (what the planner's seeking must agree with)."""
    starts, offset, previous_blank = [], 0, True
    for raw in path.read_bytes().splitlines(keepends=True):
        blank = not raw.strip()
        if not blank and (documents != "blank_line" or previous_blank):
            starts.append(offset)
        previous_blank, offset = blank, offset + len(raw)
    return starts


@pytest.mark.parametrize("documents", ["blank_line", "line"])
def test_shard_cuts_are_document_starts_found_by_seeking(tmp_path: Path, documents: str) -> None:
    """Every cut is a document start, at least `every` bytes after the last, and one of the
    first two starts there (the planner seeks rather than reading the corpus); blank lines of
    spaces or CRLF and multibyte text included."""
    rng = random.Random(0)
    words = ["a", "bb", "ccc", "dé", "ümlaut", "漢字", "x" * 40]
    lines = [
        rng.choice(["\n", "  \n", "\r\n", " \t\r\n"])
        if rng.random() < 0.3
        else " ".join(rng.choices(words, k=rng.randint(1, 12))) + rng.choice(["\n", "\r\n"])
        for _ in range(400)
    ]
    path = tmp_path / "corpus.txt"
    path.write_bytes("".join(lines).encode())
    starts = _all_document_starts(path, documents)
    for every in (1, 7, 64, 300, 5000):
        shards = plan_shards(CorpusSpec("text", (str(path),), documents=documents), every)
        cuts = [s.start for s in shards]
        assert [s.end for s in shards] == [*cuts[1:], path.stat().st_size]
        assert cuts[0] == 0 and set(cuts) <= {0, *starts}, every
        for cut, following in zip(cuts, [*cuts[1:], None]):
            after = [s for s in starts if s >= cut + every][:2]
            if following is None:
                assert len(after) < 2, (every, cut, "a shard that could be cut was not")
            else:
                assert following in after, (every, cut, following, after)


class Killed(Exception):
    pass


def test_a_killed_preprocessing_continues_from_its_finished_shards(
    corpora: tuple[Path, Tokenizer], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The run dies in its fourth shard; the rerun tokenizes that shard and the rest only,
    and the corpus equals an uninterrupted run's."""
    root, tok = corpora
    spec = _specs(root)["paragraphs"]
    real = preprocessing.tokenize_shard
    calls: list[str] = []

    def dies_at_fourth(shard, tokenizer, out, **kw):
        calls.append(out.name)
        if len(calls) == 4:
            raise Killed
        return real(shard, tokenizer, out, **kw)

    monkeypatch.setattr(preprocessing, "tokenize_shard", dies_at_fourth)
    with pytest.raises(Killed):
        preprocess(spec, tok, cache=tmp_path, workers=1, progress=False, shard_bytes=SMALL)
    finished = sorted(p.stem for p in tmp_path.glob("corpus-*.shards/0*.json"))
    assert finished == ["00000", "00001", "00002"]
    calls.clear()
    monkeypatch.setattr(
        preprocessing, "tokenize_shard", lambda *a, **k: calls.append(a[2].name) or real(*a, **k)
    )
    corpus = preprocess(spec, tok, cache=tmp_path, workers=1, progress=False, shard_bytes=SMALL)
    total = len(plan_shards(spec, SMALL))
    assert calls == [f"{k:05d}" for k in range(3, total)]
    assert _documents(corpus) == _expected(spec, tok)


def _rank_preprocess(ctx: ParallelContext, spec: CorpusSpec, tok_path: str, cache: str) -> tuple:
    import torch.distributed as dist

    tokenized: list[str] = []
    real = preprocessing.tokenize_shard
    preprocessing.tokenize_shard = lambda *a, **k: tokenized.append(a[2].name) or real(*a, **k)
    ranks = Ranks(dist.get_rank(), dist.get_world_size(), dist.barrier)
    corpus = preprocess(
        spec, Tokenizer(Path(tok_path)), cache=Path(cache), workers=1, progress=False,
        shard_bytes=SMALL, ranks=ranks,
    )  # fmt: skip
    return tokenized, _documents(corpus)


def test_torchrun_ranks_split_the_shards_and_rank_0_joins_them(
    corpora: tuple[Path, Tokenizer], tmp_path: Path
) -> None:
    """Two processes: rank r tokenizes shards r, r + 2, ...; both read the joined corpus."""
    root, tok = corpora
    spec = _specs(root)["paragraphs"]
    results = run_distributed(_rank_preprocess, 2, spec, str(tok.path), str(tmp_path))
    total = len(plan_shards(spec, SMALL))
    for rank, (tokenized, documents) in enumerate(results):
        assert tokenized == [f"{k:05d}" for k in range(rank, total, 2)]
        assert documents == _expected(spec, tok)
