"""Autoregressive generation with a tensor-parallel KV cache.

A batch of prompts of different lengths is left-padded to the longest, and every token gets its
own position (counted from its sequence's first real token, as transformers does for GPT-2 with
an attention mask), so a prompt's completion does not depend on the batch it is in. The prompt
runs in one pass (prefill) that fills each layer's cache; each decode step then runs one token
per sequence. Masks and positions for the whole generation are built once, before the loop.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

import torch
import torch.nn.functional as F
from torch import Tensor

from tpformer.inference.sampling import Sampling, next_tokens
from tpformer.layers.block import TransformerLayer
from tpformer.layers.kv_cache import KVCache
from tpformer.models.gpt import GPTForCausalLM
from tpformer.parallel.comm import gather_from_tp

DONE_CHECK_EVERY = 8
"""Without streaming or stop strings, the host reads whether every sequence has stopped once
per this many tokens (each read waits for the device)."""


@dataclass(frozen=True)
class GenerationSettings:
    max_new_tokens: int
    sampling: Sampling
    stop_tokens: frozenset[int] = frozenset()
    """Ids that end a completion (kept as its last id, as transformers does)."""


@dataclass(frozen=True)
class Batch:
    """Left-padded prompts and everything the decoding loop slices from."""

    ids: Tensor
    """[b, prompt length] prompt ids (0 on padding)."""
    positions: Tensor
    """[b, total] each slot's position (prompt, then generated slots)."""
    mask: Tensor | None
    """[b, 1, total, total] bool: query slot i may attend key slot j; None when no prompt is
    padded (causal prefill, and each decode step sees every cached slot: the fused kernels)."""

    @classmethod
    def of(cls, prompts: list[list[int]], max_new_tokens: int, device: torch.device) -> Batch:
        width = max(len(p) for p in prompts)
        total = width + max_new_tokens
        ids = torch.zeros(len(prompts), width, dtype=torch.long)
        real = torch.zeros(len(prompts), total, dtype=torch.bool)
        for row, prompt in enumerate(prompts):
            ids[row, width - len(prompt) :] = torch.tensor(prompt, dtype=torch.long)
            real[row, width - len(prompt) :] = True
        positions = (real.long().cumsum(1) - 1).clamp(min=0)
        if bool(real.all()):
            return cls(ids.to(device), positions.to(device), None)
        slot = torch.arange(total)
        causal = slot[None, :] <= slot[:, None]  # [query, key]
        # a padding slot attends to itself only: its (unused) output stays finite
        visible = real[:, None, :] | torch.eye(total, dtype=torch.bool)[None]
        mask = causal[None] & visible
        return cls(ids.to(device), positions.to(device), mask[:, None].to(device))

    def slots(self, start: int, stop: int) -> Tensor | None:
        """The mask of query slots start..stop over every key slot before stop."""
        return None if self.mask is None else self.mask[:, :, start:stop, :stop]


def decode(
    model: GPTForCausalLM,
    input_ids: Tensor,
    positions: Tensor,
    mask: Tensor | None,
    caches: list[KVCache],
) -> Tensor:
    """Run new tokens [b, s] at `positions` through the stack, appending their keys and values
    to `caches` (one per layer; `mask` [b, 1, s, cached + s] says which cached positions each
    attends to; None: causal over an empty cache, else all of it); -> the full-vocabulary logits
    of the last position [b, vocab], the same on every TP rank. Decoding holds whole sequences:
    no sequence or context parallelism."""
    gpt = model.transformer
    x = gpt.embed_at(input_ids, positions)
    for block, cache in zip(model.blocks(), caches, strict=True):
        x = block(x, mask, cache, positions)
    local = F.linear(gpt.norm(x[:, -1]), model.output_weight)  # this rank's vocab rows
    return gather_from_tp(local, model.tp)[:, : model.config.vocab_size]


def new_caches(model: GPTForCausalLM, batch: int, length: int) -> list[KVCache]:
    """One cache per layer for this rank's heads, `length` positions each."""
    param = model.transformer.wte.weight
    caches = []
    for block in model.blocks():
        attention = cast(TransformerLayer, block).attention
        caches.append(
            KVCache(
                batch,
                attention.local_kv_heads,
                length,
                attention.head_dim,
                dtype=param.dtype,
                device=param.device,
            )
        )
    return caches


@torch.no_grad()
def generate(
    model: GPTForCausalLM,
    prompts: list[list[int]],
    settings: GenerationSettings,
    generator: torch.Generator,
    *,
    stop: Callable[[int, list[int]], bool] | None = None,
    on_tokens: Callable[[list[int]], None] | None = None,
) -> list[list[int]]:
    """Each prompt's new ids (at most max_new_tokens; up to and including a stop token, or up to
    the token after which `stop(row, ids)` said so). `on_tokens` gets each step's tokens
    (streaming; it may run on one rank only). Every TP rank of the model's group must call it
    with the same prompts, settings, generator state and `stop`."""
    config = model.config
    if not prompts or min(len(p) for p in prompts) == 0:
        raise ValueError("every prompt needs at least one token")
    longest = max(len(p) for p in prompts) + settings.max_new_tokens
    if longest > config.max_position_embeddings:
        raise ValueError(
            f"the longest prompt ({longest - settings.max_new_tokens} tokens) + max_new_tokens="
            f"{settings.max_new_tokens} = {longest} exceeds the model's "
            f"max_position_embeddings={config.max_position_embeddings}"
        )
    device = model.transformer.wte.weight.device
    batch = Batch.of(prompts, settings.max_new_tokens, device)
    b, width = batch.ids.shape
    caches = new_caches(model, b, longest)
    stop_ids = torch.tensor(sorted(settings.stop_tokens), dtype=torch.long, device=device)
    out = torch.zeros(b, settings.max_new_tokens, dtype=torch.long, device=device)
    done = torch.zeros(b, dtype=torch.bool, device=device)
    host_done = [False] * b
    logits = decode(model, batch.ids, batch.positions[:, :width], batch.slots(0, width), caches)
    steps = 0
    for t in range(settings.max_new_tokens):
        token = next_tokens(logits, settings.sampling, generator)
        out[:, t] = token
        done |= torch.isin(token, stop_ids)
        steps = t + 1
        if on_tokens is not None:  # this rank's console only: no effect on when the loop ends
            on_tokens(token.tolist())
        if stop is not None:  # the same on every rank: they hold the same tokens
            written = out[:, :steps].tolist()
            host_done = [d or stop(row, written[row]) for row, d in enumerate(host_done)]
            if all(h or d for h, d in zip(host_done, done.tolist(), strict=True)):
                break
        elif steps % DONE_CHECK_EVERY == 0 and bool(done.all()):
            break
        if steps == settings.max_new_tokens:
            break
        at = width + t
        logits = decode(
            model, token[:, None], batch.positions[:, at : at + 1], batch.slots(at, at + 1), caches
        )
    rows = out[:, :steps].tolist()
    return [_trimmed(ids, settings.stop_tokens, stop, r) for r, ids in enumerate(rows)]


def _trimmed(
    ids: list[int],
    stop_tokens: frozenset[int],
    stop: Callable[[int, list[int]], bool] | None,
    row: int,
) -> list[int]:
    """ids up to and including the first stop token, or the first prefix `stop` ends."""
    for i, token in enumerate(ids):
        if token in stop_tokens or (stop is not None and stop(row, ids[: i + 1])):
            return ids[: i + 1]
    return ids
