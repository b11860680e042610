"""Synthetic pretraining samples: learnable, deterministic per global sample index, no files.

Words get a fixed random frequency rank (drawn once from the seed) and are dealt into
NUM_TOPICS groups by rank. Sample i picks a topic and draws its tokens from that group with
Zipf(1.1) frequencies (generator seeded by (seed, i)), so the MLM loss falls quickly from
ln(vocab) as the frequencies are learned, then further as the topic of the context is. For BERT
the second segment keeps the topic (NSP label 0, "is next") or switches to another one (label
1). Used by tests and benchmarks.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from tpformer.parallel.random import derive_seed

PAD, UNK, CLS, SEP, MASK = 0, 1, 2, 3, 4
FIRST_WORD = 5
NUM_TOPICS = 16
EVAL_OFFSET = 10**12
"""Evaluation samples come from an index range training never reaches."""


class SyntheticPretraining:
    """BERT (MLM + NSP) or GPT (causal LM) batches from global sample indices."""

    def __init__(
        self, *, arch: str, vocab_size: int, seq_length: int, mask_prob: float, seed: int
    ) -> None:
        if vocab_size <= FIRST_WORD + 1:
            raise ValueError(
                f"vocab_size={vocab_size} leaves no room for words after the "
                f"{FIRST_WORD} special tokens"
            )
        self.arch, self.vocab, self.seq, self.mask_prob, self.seed = (
            arch,
            vocab_size,
            seq_length,
            mask_prob,
            seed,
        )
        words = (
            torch.randperm(vocab_size - FIRST_WORD, generator=torch.Generator().manual_seed(seed))
            + FIRST_WORD
        )
        num_topics = max(2, min(NUM_TOPICS, words.numel() // 2))
        usable = words[: words.numel() // num_topics * num_topics]
        self.topics = usable.view(-1, num_topics).t().contiguous()  # topic k: ranks k, k + K, ...
        self.zipf = 1.0 / torch.arange(1, self.topics.shape[1] + 1, dtype=torch.float64) ** 1.1

    def _tokens(self, g: torch.Generator, topic: int, length: int) -> Tensor:
        picks = torch.multinomial(self.zipf, length, replacement=True, generator=g)
        return self.topics[topic][picks]

    def _sample(self, index: int) -> dict[str, Tensor]:
        g = torch.Generator().manual_seed(derive_seed(self.seed, index, 0x5EED))
        topic = int(torch.randint(0, len(self.topics), (1,), generator=g))
        if self.arch == "gpt":
            return {"input_ids": self._tokens(g, topic, self.seq)}
        half = self.seq // 2
        is_random_next = int(torch.randint(0, 2, (1,), generator=g))
        other = (topic + int(torch.randint(1, len(self.topics), (1,), generator=g))) % len(
            self.topics
        )
        ids = torch.cat(
            [
                self._tokens(g, topic, half),
                self._tokens(g, other if is_random_next else topic, self.seq - half),
            ]
        )
        ids[0], ids[half], ids[-1] = CLS, SEP, SEP
        special = torch.zeros(self.seq, dtype=torch.bool)
        special[[0, half, self.seq - 1]] = True
        # as data/masking.py: round(mask_prob x maskable) positions, so the head gathers the
        # labeled rows a real batch has (labeled_width)
        maskable = (~special).nonzero().flatten()
        budget = max(1, round(self.mask_prob * maskable.numel()))
        picked = maskable[torch.randperm(maskable.numel(), generator=g)[:budget]]
        chosen = torch.zeros(self.seq, dtype=torch.bool)
        chosen[picked] = True
        labels = torch.where(chosen, ids, torch.full_like(ids, -100))
        inputs = torch.where(chosen, torch.full_like(ids, MASK), ids)
        token_type = (torch.arange(self.seq) > half).long()
        return {
            "input_ids": inputs,
            "token_type_ids": token_type,
            "mlm_labels": labels,
            "nsp_labels": torch.tensor(is_random_next),
        }

    def batch(self, indices: Sequence[int], *, split: str = "train") -> dict[str, Tensor]:
        offset = 0 if split == "train" else EVAL_OFFSET
        samples = [self._sample(offset + i) for i in indices]
        return {k: torch.stack([s[k] for s in samples]) for k in samples[0]}
