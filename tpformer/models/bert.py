"""BERT on the tensor-parallel layers: encoder, pretraining heads, sequence classification.

Models know only layers and the context; they never import torch.distributed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tpformer.config.schema import ModelConfig
from tpformer.layers.block import TransformerStack
from tpformer.layers.dropout import ParallelDropout
from tpformer.layers.embedding import VocabParallelEmbedding
from tpformer.layers.loss import vocab_parallel_cross_entropy_and_hits
from tpformer.layers.mlp import activation_fn
from tpformer.layers.norm import make_norm
from tpformer.layers.sequence import SequenceRows, labeled_positions, sequence_rows
from tpformer.models.base import TPModel
from tpformer.parallel.comm import copy_to_tp
from tpformer.parallel.context import ParallelContext
from tpformer.parallel.init import mark_sharded


def check_sequence_length(seq_len: int, config: ModelConfig) -> None:
    if seq_len > config.max_position_embeddings:
        raise ValueError(
            f"sequence length {seq_len} exceeds model.max_position_embeddings="
            f"{config.max_position_embeddings}; shorten the input or raise the limit"
        )


class BertEmbeddings(nn.Module):
    """word (vocab-parallel) + position (learned positions) + token type (type_vocab_size > 0),
    then the norm and dropout; out for this rank's rows (SequenceRows). ModernBERT: the word
    embedding alone (rotary positions, no segments)."""

    def __init__(self, config: ModelConfig, rows: SequenceRows, ctx: ParallelContext) -> None:
        super().__init__()
        self.rows = rows
        self.word_embeddings = VocabParallelEmbedding(
            config.vocab_size,
            config.hidden_size,
            ctx.tp,
            pad_to_multiple_of=config.pad_vocab_to,
            sequence_parallel=ctx.sequence_parallel,
        )
        h = config.hidden_size
        self.position_embeddings: nn.Embedding | None = None
        if config.rotary is None:
            self.position_embeddings = nn.Embedding(config.max_position_embeddings, h)
        self.token_type_embeddings: nn.Embedding | None = None
        if config.type_vocab_size > 0:
            self.token_type_embeddings = nn.Embedding(config.type_vocab_size, h)
        self.norm = make_norm(config)
        self.dropout = ParallelDropout(
            config.dropout, ctx.rng, sequence=rows.sequence_group, context=ctx.cp
        )
        replicated = [self.position_embeddings, self.token_type_embeddings, self.norm]
        rows.mark_replicated(*(m for m in replicated if m is not None))

    def forward(
        self,
        input_ids: Tensor,
        token_type_ids: Tensor | None = None,
        position_ids: Tensor | None = None,
    ) -> Tensor:
        """input_ids [b, s] of the whole sequence -> this rank's rows (`position_ids` [b, s]:
        packed documents' positions, restarting per document)."""
        positions = self.rows.positions(input_ids.shape[1], input_ids.device)
        x = self.word_embeddings(self.rows.context_part(input_ids))
        if self.position_embeddings is not None:
            held = positions if position_ids is None else self.rows.held_positions(position_ids)
            x = x + self.position_embeddings(held)
        if self.token_type_embeddings is not None:
            if token_type_ids is None:
                x = x + self.token_type_embeddings.weight[0]
            else:
                x = x + self.token_type_embeddings(token_type_ids[:, positions])
        return self.dropout(self.norm(x))


class BertModel(TPModel):
    """Embeddings, the encoder (post-norm; pre-norm with a final norm: ModernBERT) and, with
    model.pooler=tanh, the tanh pooler over the first token."""

    def __init__(self, config: ModelConfig, ctx: ParallelContext, *, pooler: bool = True) -> None:
        super().__init__()
        self.config, self.tp, self.rows = config, ctx.tp, sequence_rows(ctx)
        self.embeddings = BertEmbeddings(config, self.rows, ctx)
        self.encoder = TransformerStack(config, ctx, causal=False)
        self.final_norm = make_norm(config) if config.norm.position == "pre" else None
        if self.final_norm is not None:
            self.rows.mark_replicated(self.final_norm)
        tanh = pooler and config.pooler == "tanh"
        self.pooler = nn.Linear(config.hidden_size, config.hidden_size) if tanh else None

    def blocks(self) -> list[nn.Module]:
        """The repeated units the engine buckets and recomputation wraps, in forward order."""
        return list(self.encoder.layers)

    def embed(
        self,
        input_ids: Tensor,
        token_type_ids: Tensor | None = None,
        position_ids: Tensor | None = None,
    ) -> Tensor:
        """The first pipeline stage's part: the input of the first block."""
        check_sequence_length(input_ids.shape[1], self.config)
        return self.embeddings(input_ids, token_type_ids, position_ids)

    def block_mask(
        self, attention_mask: Tensor | None, position_ids: Tensor | None = None
    ) -> Tensor | None:
        """Key padding, or packed documents' mask (SequenceRows.key_mask)."""
        return self.rows.key_mask(attention_mask, causal=False, position_ids=position_ids)

    def finish(self, x: Tensor) -> tuple[Tensor, Tensor | None]:
        """The last block's output -> (sequence output, tanh-pooled or None)."""
        if self.final_norm is not None:
            x = self.final_norm(x)
        if self.pooler is None:
            return x, None
        # every rank runs the pooler on the first token; a loss on it counts with
        # rows.first_token_weight() (on one CP rank)
        return x, torch.tanh(self.pooler(self.rows.first_token(x)))

    def forward(
        self,
        input_ids: Tensor,
        token_type_ids: Tensor | None = None,
        attention_mask: Tensor | None = None,
        position_ids: Tensor | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """-> (sequence output [b, s, hidden] of this rank's rows, pooled [b, hidden] or None,
        replicated). `position_ids` [b, s]: packed documents (each attends within itself, its
        positions restarting at 0)."""
        mask = self.block_mask(attention_mask, position_ids)
        x = self.embed(input_ids, token_type_ids, position_ids)
        return self.finish(self.encoder(x, mask, position_ids))


def _body_head(bert: BertModel) -> list[str]:
    """The encoder's modules that run in a pipeline's last stage: the final norm, the pooler."""
    return [f"bert.{name}" for name in ("final_norm", "pooler") if getattr(bert, name) is not None]


class _PipelinedBert(TPModel):
    """What a BERT task model tells a pipeline: the modules of its first stage (`embed`) and of
    its last (`head`); the word embedding is used by both (tied MLM decoder, or not at all)."""

    bert: BertModel
    pipeline_embedding = ("bert.embeddings",)
    pipeline_tied: tuple[str, ...] = ()

    def blocks(self) -> list[nn.Module]:
        return self.bert.blocks()

    def embed(
        self,
        input_ids: Tensor,
        token_type_ids: Tensor | None = None,
        position_ids: Tensor | None = None,
        **_: Tensor | None,
    ) -> Tensor:
        return self.bert.embed(input_ids, token_type_ids, position_ids)

    def block_mask(
        self,
        attention_mask: Tensor | None = None,
        position_ids: Tensor | None = None,
        **_: Tensor | None,
    ) -> Tensor | None:
        return self.bert.block_mask(attention_mask, position_ids)

    head: Callable[..., Any]
    """The task's output from the last block's hidden states and the batch (each subclass's)."""

    def _forward_all(self, **batch: Any) -> Any:
        x, mask, positions = (
            self.embed(**batch),
            self.block_mask(**batch),
            self.block_positions(**batch),
        )
        for block in self.blocks():
            x = block(x, mask, None, positions)
        return self.head(x, **batch)


@dataclass
class PretrainingOutput:
    """Losses are means over this micro-batch; the *_sum/_count pairs let a trainer normalize
    over the global batch. mlm_logits is this rank's vocab shard, filled when no labels are
    given. With context parallelism each is this CP rank's share: *_sum and the losses count
    its positions (and the NSP loss CP rank 0 only) over the whole micro-batch's count, so
    the sums over the CP group are the one-process values."""

    loss: Tensor | None = None
    mlm_loss: Tensor | None = None
    nsp_loss: Tensor | None = None
    mlm_loss_sum: Tensor | None = None
    mlm_count: Tensor | None = None
    mlm_correct: Tensor | None = None
    """Masked positions whose label is the argmax of the full logits."""
    nsp_correct: Tensor | None = None
    mlm_logits: Tensor | None = None
    nsp_logits: Tensor | None = None


class BertForPreTraining(_PipelinedBert):
    """MLM head tied to the word embedding (vocab-parallel loss) plus the NSP/SOP head.

    With labels, the MLM transform and vocab projection run only at masked positions
    (labels != -100), about 15% of tokens; without labels, over every position.
    """

    def __init__(self, config: ModelConfig, ctx: ParallelContext) -> None:
        super().__init__()
        self.config, self.tp = config, ctx.tp
        self.bert = BertModel(config, ctx)
        h = config.hidden_size
        self.mlm_transform = nn.Linear(h, h, bias=config.bias)
        self.mlm_act = activation_fn(config.mlp.activation)
        self.mlm_norm = make_norm(config)
        embedding = self.bert.embeddings.word_embeddings
        self.mlm_bias = mark_sharded(
            nn.Parameter(torch.zeros(embedding.rows_per_rank)), 0, config.vocab_size
        )
        self.nsp = nn.Linear(h, 2) if self.bert.pooler is not None else None  # MLM only: none
        self.pipeline_head = (
            *_body_head(self.bert),
            "mlm_transform",
            "mlm_norm",
            "mlm_bias",
            *(["nsp"] if self.nsp is not None else []),
        )

    pipeline_tied = ("bert.embeddings.word_embeddings.weight",)

    def mlm_logits(self, hidden: Tensor) -> Tensor:
        """[..., hidden] -> this rank's logits [..., padded_vocab / tp]."""
        hidden = self.mlm_norm(self.mlm_act(self.mlm_transform(hidden)))
        weight = self.bert.embeddings.word_embeddings.weight
        return F.linear(copy_to_tp(hidden, self.tp), weight, self.mlm_bias)

    def forward(
        self,
        input_ids: Tensor,
        token_type_ids: Tensor | None = None,
        attention_mask: Tensor | None = None,
        mlm_labels: Tensor | None = None,
        nsp_labels: Tensor | None = None,
        mlm_positions: Tensor | None = None,
        position_ids: Tensor | None = None,
    ) -> PretrainingOutput:
        """`position_ids` [b, s]: packed documents (data.pack), positions restarting at 0."""
        return self._forward_all(
            input_ids=input_ids,
            token_type_ids=token_type_ids,
            attention_mask=attention_mask,
            mlm_labels=mlm_labels,
            nsp_labels=nsp_labels,
            mlm_positions=mlm_positions,
            position_ids=position_ids,
        )

    def head(
        self,
        hidden: Tensor,
        input_ids: Tensor,
        mlm_labels: Tensor | None = None,
        nsp_labels: Tensor | None = None,
        mlm_positions: Tensor | None = None,
        **_: Tensor | None,
    ) -> PretrainingOutput:
        """`mlm_positions` [b, P]: the labeled positions (layers/sequence.labeled_positions,
        prepared with the batch on the host by the loader)."""
        sequence, pooled = self.bert.finish(hidden)
        out = PretrainingOutput()
        if self.nsp is not None and pooled is not None:
            out.nsp_logits = self.nsp(pooled)
        b, s = input_ids.shape
        rows = self.bert.rows
        if mlm_labels is None:  # every position this CP rank holds
            held = rows.context_positions(s, input_ids.device)
            out.mlm_logits = self.mlm_logits(rows.rows_at(sequence, held.expand(b, -1), s)[0])
            return out
        if mlm_positions is None:  # a caller other than the loader: found here, where that
            # reads nothing from a device (on the CPU), else the head runs on every position
            on_host = mlm_labels.device.type == "cpu"
            mlm_positions = (
                labeled_positions(mlm_labels)
                if on_host
                else torch.arange(s, device=input_ids.device).expand(b, -1)
            )
        # the labeled rows only (fetched from their ranks under sequence parallelism); with
        # context parallelism, this CP rank's: its loss is its share of the micro-batch's
        labeled, held = rows.rows_at(sequence, mlm_positions, s)
        labels = torch.where(held, mlm_labels.gather(1, mlm_positions), -100)
        losses, hits = vocab_parallel_cross_entropy_and_hits(
            self.mlm_logits(labeled.flatten(0, 1)),
            labels.flatten(),
            self.tp,
            vocab_size=self.config.vocab_size,
        )
        out.mlm_loss_sum, out.mlm_correct = losses.sum(), hits.sum()
        out.mlm_count = (mlm_labels != -100).sum()  # the micro-batch's, of every CP rank's rows
        out.mlm_loss = out.mlm_loss_sum / out.mlm_count.clamp(min=1)
        out.loss = out.mlm_loss
        if nsp_labels is not None and out.nsp_logits is not None:
            weight = rows.first_token_weight()
            out.nsp_loss = F.cross_entropy(out.nsp_logits.float(), nsp_labels) * weight
            out.nsp_correct = (out.nsp_logits.argmax(-1) == nsp_labels).sum() * int(weight)
            out.loss = out.loss + out.nsp_loss
        return out


@dataclass
class ClassificationOutput:
    logits: Tensor
    loss: Tensor | None = None


class BertForSequenceClassification(_PipelinedBert):
    """BERT: the tanh pooler -> dropout -> linear. ModernBERT (model.pooler=head): the first
    token or the mean over the tokens (model.classifier_pooling) -> dense, activation, norm ->
    dropout -> linear. Cross-entropy; MSE regression when num_labels == 1; binary cross-entropy
    for float (multi-hot) labels, as transformers infers the problem type."""

    def __init__(self, config: ModelConfig, ctx: ParallelContext, *, num_labels: int = 2) -> None:
        super().__init__()
        if num_labels < 1:
            raise ValueError(f"num_labels={num_labels} must be >= 1 (1 = regression)")
        self.config, self.tp, self.num_labels = config, ctx.tp, num_labels
        self.bert = BertModel(config, ctx)
        h = config.hidden_size
        self.pool_head: nn.Sequential | None = None
        if config.pooler == "head":
            self.pool_head = nn.Sequential(
                nn.Linear(h, h, bias=config.bias), activation_fn(config.mlp.activation)
            )
            self.pool_head.append(make_norm(config))
        self.dropout = ParallelDropout(config.dropout, ctx.rng)
        self.classifier = nn.Linear(h, num_labels)
        named = ["pool_head"] if self.pool_head is not None else []
        self.pipeline_head = (*_body_head(self.bert), *named, "dropout", "classifier")

    def forward(
        self,
        input_ids: Tensor,
        token_type_ids: Tensor | None = None,
        attention_mask: Tensor | None = None,
        labels: Tensor | None = None,
    ) -> ClassificationOutput:
        return self._forward_all(
            input_ids=input_ids,
            token_type_ids=token_type_ids,
            attention_mask=attention_mask,
            labels=labels,
        )

    def pooled(self, hidden: Tensor, attention_mask: Tensor | None) -> Tensor:
        """[b, hidden], replicated: the tanh pooler's output, or the pool head's."""
        sequence, pooled = self.bert.finish(hidden)
        if self.pool_head is None:
            assert pooled is not None
            return pooled
        rows = self.bert.rows
        if self.config.classifier_pooling == "mean":
            return self.pool_head(rows.mean(sequence, attention_mask))
        return self.pool_head(rows.first_token(sequence))

    def head(
        self,
        hidden: Tensor,
        labels: Tensor | None = None,
        attention_mask: Tensor | None = None,
        **_: Tensor | None,
    ) -> ClassificationOutput:
        logits = self.classifier(self.dropout(self.pooled(hidden, attention_mask)))
        if labels is None:
            return ClassificationOutput(logits)
        if self.num_labels == 1:
            loss = F.mse_loss(logits.squeeze(-1).float(), labels.float())
        elif labels.dtype.is_floating_point:  # multi-hot rows: transformers' multi-label loss
            loss = F.binary_cross_entropy_with_logits(logits.float(), labels.float())
        else:
            loss = F.cross_entropy(logits.float(), labels)
        return ClassificationOutput(logits, loss * self.bert.rows.first_token_weight())
