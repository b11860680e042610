"""Token-level loss and perplexity of a causal LM on a token stream, with a sliding window.

Windows of `seq_length` tokens start every `stride` tokens (the last one ends at the stream's
end). A token is scored once, in the first window that holds it after at least one token of
context: with a stride below seq_length every scored token but the first window's has at least
seq_length - stride tokens of context (transformers' fixed-length perplexity recipe); with
stride = seq_length each window's first token has none and is not scored. The loss is the mean
negative log-likelihood over the scored tokens; perplexity is its exponential.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from tpformer.layers.loss import vocab_parallel_cross_entropy
from tpformer.models.gpt import GPTForCausalLM
from tpformer.parallel.comm import all_reduce
from tpformer.parallel.context import ParallelContext


@dataclass(frozen=True)
class Window:
    begin: int
    end: int
    scored_from: int
    """The first position (in the stream) this window scores."""


def sliding_windows(tokens: int, seq_length: int, stride: int) -> list[Window]:
    """The windows over a stream of `tokens`, each scoring what no earlier window did."""
    if tokens < 2:
        raise ValueError(f"the text has {tokens} token(s); perplexity needs at least 2")
    if not 0 < stride <= seq_length:
        raise ValueError(f"stride={stride} must be in [1, seq_length={seq_length}]")
    windows, scored_to = [], 1
    for begin in range(0, tokens, stride):
        end = min(begin + seq_length, tokens)
        if end > scored_to:
            windows.append(Window(begin, end, max(scored_to, begin + 1)))
            scored_to = end
        if end == tokens:
            break
    return windows


@dataclass(frozen=True)
class Perplexity:
    tokens: int
    """Tokens scored."""
    nll: float
    """Their summed negative log-likelihood (nats)."""
    windows: int

    @property
    def loss(self) -> float:
        return self.nll / self.tokens

    @property
    def perplexity(self) -> float:
        return math.exp(self.loss)


def _batch(stream: Tensor, windows: list[Window], device: torch.device) -> tuple[Tensor, Tensor]:
    """Right-padded ids [b, longest] and next-token targets [b, longest - 1] (-100: unscored;
    causal attention keeps the padding out of every real position)."""
    longest = max(w.end - w.begin for w in windows)
    ids = torch.zeros(len(windows), longest, dtype=torch.long)
    targets = torch.full((len(windows), longest - 1), -100, dtype=torch.long)
    for row, w in enumerate(windows):
        ids[row, : w.end - w.begin] = stream[w.begin : w.end]
        first = w.scored_from - w.begin  # a target at index j is token j + 1 of the window
        targets[row, first - 1 : w.end - w.begin - 1] = stream[w.scored_from : w.end]
    return ids.to(device), targets.to(device)


@torch.no_grad()
def perplexity(
    model: GPTForCausalLM,
    stream: Tensor,
    ctx: ParallelContext,
    *,
    seq_length: int,
    stride: int,
    batch_size: int,
) -> Perplexity:
    """Score `stream` (1-D token ids); DP ranks take every dp-th batch of windows, the sums are
    all-reduced over DP (float64)."""
    windows = sliding_windows(len(stream), seq_length, stride)
    batches = [windows[i : i + batch_size] for i in range(0, len(windows), batch_size)]
    sums = torch.zeros(2, dtype=torch.float64, device=ctx.device)
    for batch in batches[ctx.dp.rank :: ctx.dp.size]:
        ids, targets = _batch(stream, batch, ctx.device)
        logits = model(ids).logits[:, :-1]  # this rank's vocabulary shard
        losses = vocab_parallel_cross_entropy(
            logits.reshape(-1, logits.shape[-1]).float(),
            targets.reshape(-1),
            model.tp,
            vocab_size=model.config.vocab_size,
        )
        sums[0] += losses.double().sum()
        sums[1] += (targets != -100).sum()
    all_reduce(sums, ctx.dp)
    nll, count = sums.tolist()
    return Perplexity(int(count), nll, len(windows))
