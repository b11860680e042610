"""A small generated corpus and a sentencepiece tokenizer trained on it, made by the tests."""

from __future__ import annotations

import random
from pathlib import Path

from tpformer.data.corpus import CorpusSpec, split_sentences
from tpformer.data.tokenizer import Tokenizer, train_sentencepiece

SUBJECTS = [
    "the king",
    "the queen",
    "a fool",
    "the duke",
    "my lord",
    "his daughter",
    "the ghost",
    "our captain",
    "a servant",
    "the witch",
    "fair lady",
    "old gentleman",
]
VERBS = ["loves", "fears", "betrays", "follows", "remembers", "forgives", "summons", "mocks"]
OBJECTS = [
    "the crown",
    "a sword",
    "the letter",
    "his horse",
    "the castle",
    "a ring",
    "the storm",
    "her brother",
    "the moon",
    "sweet music",
    "the forest",
    "cold water",
]
ENDINGS = ["tonight", "in secret", "with honour", "at dawn", "for ever", "without reason"]


def sentence(rng: random.Random, topic: int) -> str:
    """The subject comes from the document's topic and fixes the verb and object, so a masked
    word is predictable from its context (the corpus is learnable in a few hundred steps)."""
    who = (topic + rng.randrange(3)) % len(SUBJECTS)
    verb, obj = VERBS[(who + topic) % len(VERBS)], OBJECTS[(2 * who) % len(OBJECTS)]
    return f"{SUBJECTS[who].capitalize()} {verb} {obj} {ENDINGS[rng.randrange(2) + topic % 3]}."


def write_corpus(path: Path, *, documents: int = 40, sentences: int = 12, seed: int = 0) -> Path:
    """Plain text: documents separated by blank lines, a few sentences per line."""
    rng = random.Random(seed)
    docs = []
    for d in range(documents):
        lines = [" ".join(sentence(rng, d % 7) for _ in range(3)) for _ in range(sentences // 3)]
        docs.append("\n".join(lines))
    path.write_text("\n\n".join(docs) + "\n", encoding="utf-8")
    return path


def corpus_tokenizer(corpus: Path, out: Path, vocab_size: int = 160) -> Tokenizer:
    docs = corpus.read_text().split("\n\n")
    sentences = [s for d in docs for s in split_sentences(d)]
    return Tokenizer(train_sentencepiece(sentences, out, vocab_size=vocab_size))


def text_spec(*paths: Path) -> CorpusSpec:
    return CorpusSpec(source="text", paths=tuple(str(p) for p in paths))
