"""Synthetic pretraining samples: learnable, deterministic per global sample index, no files.

Sample i is an arithmetic progression of token ids (random start and stride drawn from a
generator seeded by (seed, i)), so a masked token is predictable from its neighbours and the
MLM loss falls well below ln(vocab). Used by the trainer tests, benchmarks and the default run.
"""

from __future__ import annotations

import torch
from torch import Tensor

from tpformer.parallel.random import derive_seed

PAD, UNK, CLS, SEP, MASK = 0, 1, 2, 3, 4
FIRST_WORD = 5


class SyntheticPretraining:
    """BERT (MLM + NSP) or GPT (causal LM) batches from global sample indices."""

    def __init__(self, *, arch: str, vocab_size: int, seq_length: int, mask_prob: float,
                 seed: int) -> None:
        if vocab_size <= FIRST_WORD + 1:
            raise ValueError(f"vocab_size={vocab_size} leaves no room for words after the "
                             f"{FIRST_WORD} special tokens")
        self.arch, self.vocab, self.seq, self.mask_prob, self.seed = (
            arch, vocab_size, seq_length, mask_prob, seed)

    def _sample(self, index: int) -> dict[str, Tensor]:
        g = torch.Generator().manual_seed(derive_seed(self.seed, index, 0x5EED))
        words = self.vocab - FIRST_WORD
        start = int(torch.randint(0, words, (1,), generator=g))
        stride = int(torch.randint(1, 8, (1,), generator=g))
        ids = FIRST_WORD + (start + stride * torch.arange(self.seq)) % words
        if self.arch == "gpt":
            return {"input_ids": ids}
        ids[0], ids[self.seq // 2], ids[-1] = CLS, SEP, SEP
        special = torch.zeros(self.seq, dtype=torch.bool)
        special[[0, self.seq // 2, self.seq - 1]] = True
        chosen = (torch.rand(self.seq, generator=g) < self.mask_prob) & ~special
        labels = torch.where(chosen, ids, torch.full_like(ids, -100))
        inputs = torch.where(chosen, torch.full_like(ids, MASK), ids)
        token_type = (torch.arange(self.seq) > self.seq // 2).long()
        return {"input_ids": inputs, "token_type_ids": token_type, "mlm_labels": labels,
                "nsp_labels": torch.tensor(stride % 2)}

    def batch(self, indices: range) -> dict[str, Tensor]:
        samples = [self._sample(i) for i in indices]
        return {k: torch.stack([s[k] for s in samples]) for k in samples[0]}
