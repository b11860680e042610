"""Weighted blends of corpora (Megatron-LM's `--data-path 0.7 wiki 0.3 books`): every training
sample is drawn from one corpus, in proportion to the weights, as a pure function of (seed,
global index), so the order survives a resume and a resume on another world size.

The global order is cut into blocks of `block` samples. Corpus k owns
round(C_k x n) - round(C_(k-1) x n) of the first n samples at every block boundary n (C: the
cumulative normalized weights), so its share never strays more than one sample from its weight
there (the block holds at least 2 / min weight samples, so no corpus's count in a block goes
negative); within a block its slots are shuffled from (seed, block). Corpus k's j-th sample is its
own dataset's sample j: each corpus keeps its own epochs and shuffle (a small corpus repeats
sooner, as in Megatron-LM's BlendedDataset).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np
import torch
from torch import Tensor

from tpformer.parallel.random import derive_seed

_BLEND = 0xB1E0
EVAL_PREFIX = "eval/"
"""split="eval/<label>": the held-out samples of one corpus of the blend."""


class SampleSource(Protocol):
    """A pretraining dataset: the batch of given sample indices of a split."""

    def batch(self, indices: Sequence[int], *, split: str = "train") -> dict[str, Tensor]: ...


class BlendSchedule:
    """Global sample index -> (corpus, the corpus's own sample index)."""

    def __init__(self, weights: Sequence[float], seed: int, *, block: int = 4096) -> None:
        w = np.asarray(weights, dtype=np.float64)
        if w.ndim != 1 or len(w) == 0 or not np.all(w > 0) or not np.all(np.isfinite(w)):
            raise ValueError(f"blend weights {list(weights)} must be positive numbers")
        share = w / w.sum()
        self.cumulative = np.cumsum(share)
        self.seed, self.block = seed, max(block, int(np.ceil(2 / share.min())))
        self._blocks: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    def counts_before(self, n: int) -> np.ndarray:
        """How many of the first n samples (n a block boundary) each corpus owns."""
        edges = np.floor(self.cumulative * n + 0.5).astype(np.int64)
        edges[-1] = n
        return np.diff(edges, prepend=0)

    def _block(self, b: int) -> tuple[np.ndarray, np.ndarray]:
        if b not in self._blocks:
            start = self.counts_before(b * self.block)
            owned = self.counts_before((b + 1) * self.block) - start
            g = torch.Generator().manual_seed(derive_seed(self.seed, b, _BLEND))
            corpus = np.repeat(np.arange(len(owned)), owned)[
                torch.randperm(self.block, generator=g)
            ]
            own = np.empty(self.block, dtype=np.int64)
            for k in range(len(owned)):
                slots = np.flatnonzero(corpus == k)
                own[slots] = start[k] + np.arange(len(slots))
            if len(self._blocks) >= 4:  # a step reads one or two blocks
                self._blocks.pop(next(iter(self._blocks)))
            self._blocks[b] = (corpus, own)
        return self._blocks[b]

    def __call__(self, indices: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        index = np.asarray(indices, dtype=np.int64).reshape(-1)
        corpus, own = np.empty_like(index), np.empty_like(index)
        for b in np.unique(index // self.block):
            at = np.flatnonzero(index // self.block == b)
            block_corpus, block_own = self._block(int(b))
            corpus[at], own[at] = (
                block_corpus[index[at] % self.block],
                block_own[index[at] % self.block],
            )
        return corpus, own


class BlendedSamples:
    """Training samples of several datasets, blended by BlendSchedule; `eval/<label>` splits
    are each corpus's held-out samples, which the evaluator reports one by one."""

    def __init__(
        self,
        parts: Sequence[SampleSource],
        weights: Sequence[float],
        labels: Sequence[str],
        seed: int,
    ) -> None:
        if len(set(labels)) != len(labels):
            raise ValueError(
                f"data.blend labels {list(labels)} must differ (set data.blend[i].label)"
            )
        self.parts, self.labels = list(parts), list(labels)
        total = float(sum(weights))
        self.weights = [w / total for w in weights]
        self.schedule = BlendSchedule(weights, seed)

    @property
    def eval_splits(self) -> dict[str, float]:
        """split name -> the corpus's weight, for the evaluator's per-corpus losses."""
        return {f"{EVAL_PREFIX}{label}": w for label, w in zip(self.labels, self.weights)}

    def batch(self, indices: Sequence[int], *, split: str = "train") -> dict[str, Tensor]:
        if split.startswith(EVAL_PREFIX):
            part = self.parts[self.labels.index(split[len(EVAL_PREFIX) :])]
            return part.batch(indices, split="eval")
        if split != "train":
            raise ValueError(f"a blend has splits train and {list(self.eval_splits)}, not {split}")
        corpus, own = self.schedule(indices)
        rows: list[Tensor] = []
        pieces: list[dict[str, Tensor]] = []
        for k in np.unique(corpus):
            at = np.flatnonzero(corpus == k)
            pieces.append(self.parts[int(k)].batch(own[at].tolist(), split="train"))
            rows.append(torch.from_numpy(at))
        order = torch.argsort(torch.cat(rows))  # back to the order of `indices`
        return {key: torch.cat([p[key] for p in pieces])[order] for key in pieces[0]}
