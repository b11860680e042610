"""The causal decoder on the tensor-parallel layers: GPT-2 (learned positions, LayerNorm, GELU,
a tied LM head) and, by the model keys, the Llama family (rotary positions, RMSNorm, SwiGLU,
grouped-query attention, no biases, an LM head of its own)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import cast

from torch import Tensor, nn

from tpformer.config.schema import ModelConfig
from tpformer.layers.block import TransformerLayer, TransformerStack
from tpformer.layers.dropout import ParallelDropout
from tpformer.layers.embedding import VocabParallelEmbedding
from tpformer.layers.loss import vocab_parallel_cross_entropy
from tpformer.layers.norm import make_norm
from tpformer.layers.sequence import sequence_rows
from tpformer.models.base import TPModel
from tpformer.models.bert import check_sequence_length
from tpformer.parallel.context import ParallelContext
from tpformer.parallel.init import normal_init, set_init


class GPTModel(TPModel):
    """Token (vocab-parallel) embeddings (+ learned positions), pre-norm causal stack, final
    norm."""

    def __init__(self, config: ModelConfig, ctx: ParallelContext) -> None:
        super().__init__()
        self.config, self.tp, self.rows = config, ctx.tp, sequence_rows(ctx)
        self.wte = VocabParallelEmbedding(
            config.vocab_size,
            config.hidden_size,
            ctx.tp,
            pad_to_multiple_of=config.pad_vocab_to,
            sequence_parallel=ctx.sequence_parallel,
        )
        self.wpe: nn.Embedding | None = None  # rotary positions live in the attention
        if config.rotary is None:
            self.wpe = nn.Embedding(config.max_position_embeddings, config.hidden_size)
            self.rows.mark_replicated(self.wpe)
        self.dropout = ParallelDropout(
            config.dropout, ctx.rng, sequence=self.rows.sequence_group, context=ctx.cp
        )
        self.decoder = TransformerStack(config, ctx, causal=True)
        self.norm = make_norm(config)
        self.rows.mark_replicated(self.norm)
        # GPT-2: residual output projections start at std / sqrt(2 * layers).
        scaled = normal_init(config.init_std / math.sqrt(2 * config.num_layers))
        for layer in cast("list[TransformerLayer]", list(self.decoder.layers)):
            set_init(layer.attention.out.weight, scaled)
            set_init(layer.mlp.fc_out.weight, scaled)

    def blocks(self) -> list[nn.Module]:
        """The repeated units the engine buckets and recomputation wraps, in forward order."""
        return list(self.decoder.layers)

    def embed(self, input_ids: Tensor, position_ids: Tensor | None = None) -> Tensor:
        """The first pipeline stage's part: input_ids [b, s] of the whole sequence -> the input
        of the first block (this rank's rows); `position_ids` [b, s]: packed documents'."""
        s = input_ids.shape[1]
        check_sequence_length(s, self.config)
        positions = self.rows.positions(s, input_ids.device)
        if position_ids is not None:
            positions = self.rows.held_positions(position_ids)
        return self.embed_at(self.rows.context_part(input_ids), positions)

    def embed_at(self, input_ids: Tensor, positions: Tensor) -> Tensor:
        """Tokens [b, s] at the given positions (broadcast to [b, s]) -> the first block's input."""
        tokens = self.wte(input_ids)
        return self.dropout(tokens if self.wpe is None else tokens + self.wpe(positions))

    def block_mask(
        self, attention_mask: Tensor | None = None, position_ids: Tensor | None = None
    ) -> Tensor | None:
        """Causal and key padding together (None: causal only, which attention applies);
        packed documents: each within its own."""
        return self.rows.key_mask(attention_mask, causal=True, position_ids=position_ids)

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        position_ids: Tensor | None = None,
    ) -> Tensor:
        """-> hidden states [b, s, hidden] of this rank's rows (SequenceRows)."""
        x = self.embed(input_ids, position_ids)
        x = self.decoder(x, self.block_mask(attention_mask, position_ids), position_ids)
        return self.norm(x)


@dataclass
class CausalLMOutput:
    logits: Tensor
    """This rank's vocab shard [b, s, padded_vocab / tp]."""
    loss: Tensor | None = None
    loss_sum: Tensor | None = None
    """The summed next-token losses (a trainer divides by the global batch's count)."""


class GPTForCausalLM(TPModel):
    """LM head tied to wte (or, untied, a vocabulary-parallel weight of its own); labels are
    aligned with input_ids and shifted inside, as in HF."""

    def __init__(self, config: ModelConfig, ctx: ParallelContext) -> None:
        super().__init__()
        self.config, self.tp = config, ctx.tp
        self.transformer = GPTModel(config, ctx)
        self.lm_head: VocabParallelEmbedding | None = None
        if not config.tie_embeddings:  # the same [vocab / tp, hidden] shard as wte's
            self.lm_head = VocabParallelEmbedding(
                config.vocab_size,
                config.hidden_size,
                ctx.tp,
                pad_to_multiple_of=config.pad_vocab_to,
            )
        learned = ["transformer.wpe"] if config.rotary is None else []
        self.pipeline_embedding = ("transformer.wte", *learned)
        self.pipeline_head = ("transformer.norm", *([] if config.tie_embeddings else ["lm_head"]))
        self.pipeline_tied = ("transformer.wte.weight",) if config.tie_embeddings else ()

    @property
    def output_weight(self) -> Tensor:
        """This rank's vocabulary rows of the LM head: wte's when tied."""
        return (self.lm_head or self.transformer.wte).weight

    def blocks(self) -> list[nn.Module]:
        return self.transformer.blocks()

    def embed(
        self, input_ids: Tensor, position_ids: Tensor | None = None, **_: Tensor | None
    ) -> Tensor:
        return self.transformer.embed(input_ids, position_ids)

    def block_mask(
        self,
        attention_mask: Tensor | None = None,
        position_ids: Tensor | None = None,
        **_: Tensor | None,
    ) -> Tensor | None:
        return self.transformer.block_mask(attention_mask, position_ids)

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor | None = None,
        labels: Tensor | None = None,
        position_ids: Tensor | None = None,
    ) -> CausalLMOutput:
        """`position_ids` [b, s]: packed documents (data.pack): each attends within itself and
        its positions restart at 0; the labels say which targets count (a document's first
        token is not predicted from the one before)."""
        x, mask = self.embed(input_ids, position_ids), self.block_mask(attention_mask, position_ids)
        for block in self.blocks():
            x = block(x, mask, None, position_ids)
        return self.head(x, labels=labels)

    def head(self, x: Tensor, labels: Tensor | None = None, **_: Tensor | None) -> CausalLMOutput:
        """The last pipeline stage's part: final norm, LM head and loss (this rank's
        share: the sum over its positions over the micro-batch's count, so the sum over a
        context-parallel group is the mean)."""
        rows = self.transformer.rows
        logits = rows.vocab_logits(self.transformer.norm(x), self.output_weight)
        if labels is None:
            return CausalLMOutput(logits)
        predicting, targets = rows.next_token_targets(logits, labels)
        losses = vocab_parallel_cross_entropy(
            predicting, targets, self.tp, vocab_size=self.config.vocab_size
        )
        total = losses.sum()
        return CausalLMOutput(logits, total / (labels[:, 1:] != -100).sum().clamp(min=1), total)
