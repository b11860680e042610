"""GPT-2 on the tensor-parallel layers: pre-LayerNorm causal decoder and a tied LM head."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tpformer.config.schema import ModelConfig
from tpformer.layers.block import TransformerLayer, TransformerStack
from tpformer.layers.dropout import ParallelDropout
from tpformer.layers.embedding import VocabParallelEmbedding
from tpformer.layers.kv_cache import KVCache
from tpformer.layers.linear import sequence_gathered_linear
from tpformer.layers.loss import vocab_parallel_cross_entropy
from tpformer.layers.sequence import context_part, local_positions
from tpformer.models.base import TPModel
from tpformer.models.bert import check_sequence_length
from tpformer.parallel.comm import copy_to_tp, gather_from_tp
from tpformer.parallel.context import ParallelContext
from tpformer.parallel.init import mark_sequence_parallel, normal_init, set_init


class GPTModel(TPModel):
    """Token (vocab-parallel) + position embeddings, pre-LN causal stack, final LayerNorm."""

    def __init__(self, config: ModelConfig, ctx: ParallelContext) -> None:
        super().__init__()
        self.config, self.tp, self.sequence_parallel = config, ctx.tp, ctx.sequence_parallel
        self.cp = ctx.cp
        self.wte = VocabParallelEmbedding(
            config.vocab_size,
            config.hidden_size,
            ctx.tp,
            pad_to_multiple_of=config.pad_vocab_to,
            sequence_parallel=ctx.sequence_parallel,
        )
        self.wpe = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.dropout = ParallelDropout(
            config.dropout,
            ctx.rng,
            sequence=ctx.tp if ctx.sequence_parallel else None,
            context=ctx.cp,
        )
        self.decoder = TransformerStack(config, ctx, pre_norm=True, causal=True)
        self.norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        if ctx.sequence_parallel:
            mark_sequence_parallel(self.wpe, self.norm)
        # GPT-2: residual output projections start at std / sqrt(2 * layers).
        scaled = normal_init(config.init_std / math.sqrt(2 * config.num_layers))
        for layer in cast("list[TransformerLayer]", list(self.decoder.layers)):
            set_init(layer.attention.out.weight, scaled)
            set_init(layer.mlp.fc_out.weight, scaled)

    def blocks(self) -> list[nn.Module]:
        """The repeated units the engine buckets and recomputation wraps, in forward order."""
        return list(self.decoder.layers)

    def embed(self, input_ids: Tensor, positions: Tensor | None = None) -> Tensor:
        """The first pipeline stage's part: the input of the first block. `positions` [b, s]:
        each token's (decoding: left-padded prompts count from their first real token)."""
        s = input_ids.shape[1]
        if positions is None:
            check_sequence_length(s, self.config)
            positions = local_positions(
                s, self.tp, self.sequence_parallel, input_ids.device, self.cp
            )
            input_ids = context_part(input_ids, self.cp)  # this CP rank's positions
        return self.dropout(self.wte(input_ids) + self.wpe(positions))

    def block_mask(self, input_ids: Tensor, attention_mask: Tensor | None = None) -> Tensor | None:
        """Causal and key padding together (None: causal only, which attention applies); with
        context parallelism the key padding alone (ring attention builds the causal part from
        positions)."""
        if attention_mask is None:
            return None
        if self.cp.size > 1:
            return attention_mask.bool()[:, None, None, :]
        s = input_ids.shape[1]
        causal = torch.ones(s, s, dtype=torch.bool, device=input_ids.device).tril()
        return causal[None, None] & attention_mask.bool()[:, None, None, :]

    def forward(self, input_ids: Tensor, attention_mask: Tensor | None = None) -> Tensor:
        """-> hidden states [b, s, hidden], replicated (with sequence parallelism: this rank's
        chunk [b, s/tp, hidden])."""
        x = self.decoder(self.embed(input_ids), self.block_mask(input_ids, attention_mask))
        return self.norm(x)


@dataclass
class CausalLMOutput:
    logits: Tensor
    """This rank's vocab shard [b, s, padded_vocab / tp]."""
    loss: Tensor | None = None


class GPTForCausalLM(TPModel):
    """LM head tied to wte; labels are aligned with input_ids and shifted inside, as in HF."""

    def __init__(self, config: ModelConfig, ctx: ParallelContext) -> None:
        super().__init__()
        self.config, self.tp, self.sequence_parallel = config, ctx.tp, ctx.sequence_parallel
        self.cp = ctx.cp
        self.transformer = GPTModel(config, ctx)

    pipeline_embedding = ("transformer.wte", "transformer.wpe")
    pipeline_head = ("transformer.norm",)
    pipeline_tied = ("transformer.wte.weight",)

    def blocks(self) -> list[nn.Module]:
        return self.transformer.blocks()

    def embed(self, input_ids: Tensor, **_: Tensor | None) -> Tensor:
        return self.transformer.embed(input_ids)

    def block_mask(
        self, input_ids: Tensor, attention_mask: Tensor | None = None, **_: Tensor | None
    ) -> Tensor | None:
        return self.transformer.block_mask(input_ids, attention_mask)

    def forward(
        self, input_ids: Tensor, attention_mask: Tensor | None = None, labels: Tensor | None = None
    ) -> CausalLMOutput:
        x = self.embed(input_ids)
        mask = self.block_mask(input_ids, attention_mask)
        for block in self.blocks():
            x = block(x, mask)
        return self.head(x, labels=labels)

    def decode(
        self, input_ids: Tensor, positions: Tensor, mask: Tensor | None, caches: list[KVCache]
    ) -> Tensor:
        """Run new tokens [b, s] at `positions` through the stack, appending their keys and
        values to `caches` (one per layer; `mask` [b, 1, s, cached + s] says which cached
        positions each attends to; None: causal over an empty cache, else all of it); -> the
        full-vocabulary logits of the last position [b, vocab], the same on every TP rank."""
        x = self.transformer.embed(input_ids, positions)
        for block, cache in zip(self.blocks(), caches, strict=True):
            x = block(x, mask, cache)
        hidden = self.transformer.norm(x[:, -1])
        local = F.linear(hidden, self.transformer.wte.weight)  # this rank's vocab rows
        return gather_from_tp(local, self.tp)[:, : self.config.vocab_size]

    def head(self, x: Tensor, labels: Tensor | None = None, **_: Tensor | None) -> CausalLMOutput:
        """The last pipeline stage's part: final LayerNorm, tied LM head and loss."""
        hidden = self.transformer.norm(x)
        # every position feeds the vocab-parallel projection: the whole sequence on each rank
        # (sequence parallelism: all-gathered, the gradient reduce-scattered back)
        weight = self.transformer.wte.weight
        logits = (
            sequence_gathered_linear(hidden, weight, None, self.tp)
            if self.sequence_parallel
            else F.linear(copy_to_tp(hidden, self.tp), weight)
        )
        if labels is None:
            return CausalLMOutput(logits)
        if self.cp.size > 1:
            return CausalLMOutput(logits, self._context_loss(logits, labels))
        shifted = logits[:, :-1].reshape(-1, logits.shape[-1])
        targets = labels[:, 1:].reshape(-1)
        losses = vocab_parallel_cross_entropy(
            shifted, targets, self.tp, vocab_size=self.config.vocab_size
        )
        return CausalLMOutput(logits, losses.sum() / (targets != -100).sum().clamp(min=1))

    def _context_loss(self, logits: Tensor, labels: Tensor) -> Tensor:
        """Context parallelism: logits of this CP rank's positions, labels [b, s] of the whole
        sequence. Each position predicts the next token (the last one nothing), so the targets
        are shifted over the whole sequence before this rank's positions are taken; the loss is
        this rank's sum over the micro-batch's count (the CP group's sum is the mean)."""
        targets = F.pad(labels[:, 1:], (0, 1), value=-100)
        targets = context_part(targets, self.cp).reshape(-1)
        losses = vocab_parallel_cross_entropy(
            logits.reshape(-1, logits.shape[-1]),
            targets,
            self.tp,
            vocab_size=self.config.vocab_size,
        )
        return losses.sum() / (labels[:, 1:] != -100).sum().clamp(min=1)
