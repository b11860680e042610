"""What the heads take from a sequence-sharded encoder output, with the fewest bytes, and which
positions a rank holds (sequence and context parallelism).

Under sequence parallelism the last layer leaves [b, s/tp, h] on each TP rank. The MLM head
needs only the masked positions (about 15%, given with the batch: `labeled_positions`), the
pooler only the first token; these helpers fetch exactly those rows and hand them out
replicated, as the heads expect. Without sequence parallelism they are plain indexing.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from tpformer.layers.linear import sequence_gathered_linear
from tpformer.parallel.comm import copy_to_tp, from_first_rank, reduce_from_tp, sequence_range
from tpformer.parallel.context import ParallelContext
from tpformer.parallel.handle import GroupHandle
from tpformer.parallel.init import mark_sequence_parallel
from tpformer.parallel.sequence_chunks import context_positions


def local_positions(
    seq_len: int,
    tp: GroupHandle,
    sequence_parallel: bool,
    device: torch.device,
    cp: GroupHandle | None = None,
) -> Tensor:
    """The global positions of the rows this rank holds: all of them, this CP rank's two
    mirrored chunks (context parallelism), and of those its TP chunk (sequence parallelism)."""
    positions = (
        torch.arange(seq_len, device=device)
        if cp is None
        else context_positions(seq_len, cp.rank, cp.size, device)
    )
    if not sequence_parallel:
        return positions
    local = positions.numel() // tp.size
    return positions.narrow(0, sequence_range(local, tp)[0], local)


def document_mask(position_ids: Tensor, attention_mask: Tensor | None, *, causal: bool) -> Tensor:
    """Packed documents: bool [b, 1, s, s], True where query and key are in the same document
    (a document starts where `position_ids` restarts at 0), the key is a token (attention_mask
    [b, s], 1 = token; None: all are) and, when `causal`, not after the query. Padding after the
    last document continues its positions, so a padding query attends to that document's tokens
    (never to nothing, which would give NaN) and no token attends to padding."""
    document = (position_ids == 0).cumsum(dim=1)
    mask = document[:, None, :, None] == document[:, None, None, :]
    if attention_mask is not None:
        mask = mask & attention_mask.bool()[:, None, None, :]
    if causal:
        s = position_ids.shape[1]
        mask = mask & torch.ones(s, s, dtype=torch.bool, device=mask.device).tril()
    return mask


def context_part(x: Tensor, cp: GroupHandle) -> Tensor:
    """x [b, s, ...] of the whole sequence -> this CP rank's positions [b, s / cp, ...]."""
    if cp.size == 1:
        return x
    return x.index_select(1, context_positions(x.shape[1], cp.rank, cp.size, x.device))


def first_token(hidden: Tensor, tp: GroupHandle, sequence_parallel: bool) -> Tensor:
    """hidden[:, 0] of the whole sequence, replicated: one broadcast of [b, h] from the rank
    that holds position 0."""
    return from_first_rank(hidden[:, 0], tp) if sequence_parallel else hidden[:, 0]


def labeled_width(seq: int, mask_prob: float, *, special: int = 3, multiple: int = 8) -> int:
    """P of `labeled_positions` for a batch of full samples of `seq` tokens, `special` of them
    not maskable ([CLS] a [SEP] b [SEP]): data/masking.py labels round(mask_prob x maskable) of
    each, and the width rounds that up to `multiple`. What the BERT head gathers per sample (the
    planner's activation memory)."""
    most = max(1, round(mask_prob * (seq - special)))
    return min(seq, -(-most // multiple) * multiple)


def labeled_positions(labels: Tensor, *, ignore_index: int = -100, multiple: int = 8) -> Tensor:
    """[b, P]: each sequence's labeled positions, ascending, then unlabeled ones as padding (their
    labels are ignored), P the batch's largest count rounded up to `multiple` (fewer distinct
    shapes), at most s. Computed on the host when the batch is prepared (it reads the count), so
    the head gathers its rows without a device sync (Google's masked_lm_positions)."""
    labeled = labels != ignore_index
    most = int(labeled.sum(dim=1).max()) if labels.numel() else 0
    width = min(labels.shape[1], max(multiple, -(-most // multiple) * multiple))
    unlabeled_last = torch.argsort((~labeled).to(torch.int8), dim=1, stable=True)
    return unlabeled_last[:, :width]


def rows_at(
    hidden: Tensor,
    positions: Tensor,
    seq_len: int,
    tp: GroupHandle,
    sequence_parallel: bool,
    cp: GroupHandle,
) -> tuple[Tensor, Tensor]:
    """(rows [b, P, h] of the encoder output at the global `positions` [b, P], replicated over
    the TP group; held [b, P] bool, whether this CP rank holds each position). hidden is this
    rank's rows (local_positions); a position this rank does not hold gives a zero row. Under
    sequence parallelism each position is held by one TP rank: the rows are summed over the
    group (one all-reduce of [b, P, h], identity backward: each rank's rows get their gradient).
    Only device indexing: no count is read on the host. NOTE: under context parallelism every
    CP rank gets all P rows (those it does not hold as zeros, their labels ignored), so the MLM
    head does cp times the work of the labeled rows; keeping only its own would need each CP
    rank's count on the host (a loader that knows the layout)."""
    device = hidden.device
    mine = local_positions(seq_len, tp, sequence_parallel, device, cp)
    row_of = torch.full((seq_len,), -1, dtype=torch.long, device=device)
    row_of[mine] = torch.arange(mine.numel(), device=device)
    local = row_of[positions]  # [b, P], -1 where another rank holds it
    present = local >= 0
    index = local.clamp(min=0).unsqueeze(-1).expand(-1, -1, hidden.shape[-1])
    rows = torch.where(present.unsqueeze(-1), hidden.gather(1, index), 0.0)
    if sequence_parallel and tp.size > 1:
        rows = reduce_from_tp(rows, tp)
    if cp.size == 1:
        return rows, torch.ones_like(present)
    held = torch.zeros(seq_len, dtype=torch.bool, device=device)
    held[local_positions(seq_len, tp, False, device, cp)] = True
    return rows, held[positions]


class SequenceRows:
    """Which rows of each sequence this rank holds, and how a model moves between them and the
    whole sequence: the one place a BERT or GPT model meets sequence and context parallelism.

    Rows held: all of them; under context parallelism this CP rank's two mirrored chunks; under
    sequence parallelism, of those, this TP rank's chunk. Every method is the plain operation
    when neither is on, so a model calls them unconditionally and knows no layout.
    """

    def __init__(self, tp: GroupHandle, sequence_parallel: bool, cp: GroupHandle) -> None:
        self.tp, self.sequence_parallel, self.cp = tp, sequence_parallel, cp

    @property
    def sequence_group(self) -> GroupHandle | None:
        """The group a replicated region's rows are split over (sequence parallelism), else None."""
        return self.tp if self.sequence_parallel else None

    @property
    def split_over_context(self) -> bool:
        return self.cp.size > 1

    def positions(self, seq_len: int, device: torch.device) -> Tensor:
        """The global positions of the rows this rank holds between blocks."""
        return local_positions(seq_len, self.tp, self.sequence_parallel, device, self.cp)

    def context_positions(self, seq_len: int, device: torch.device) -> Tensor:
        """The global positions this CP rank holds (all of its TP group's rows)."""
        return local_positions(seq_len, self.tp, False, device, self.cp)

    def context_part(self, x: Tensor) -> Tensor:
        """x [b, s, ...] of the whole sequence -> this CP rank's positions."""
        return context_part(x, self.cp)

    def first_token(self, hidden: Tensor) -> Tensor:
        """hidden[:, 0] of the whole sequence, replicated on every rank (the pooler's input)."""
        return from_first_rank(first_token(hidden, self.tp, self.sequence_parallel), self.cp)

    def mean(self, hidden: Tensor, attention_mask: Tensor | None) -> Tensor:
        """The mean of the whole sequence's rows over its tokens (attention_mask [b, s], 1 =
        token; None: every position), replicated as first_token's: this rank's rows summed,
        then over the sequence's ranks (TP under SP: all-reduce, identity backward as for any
        replicated region; CP: all-reduce both ways, as only CP rank 0's loss counts)."""
        if attention_mask is None:
            s = hidden.shape[1] * self.cp.size * (self.tp.size if self.sequence_parallel else 1)
            attention_mask = torch.ones(hidden.shape[0], s, device=hidden.device)
        s = attention_mask.shape[1]
        weights = attention_mask.to(hidden.dtype)
        held = weights[:, self.positions(s, hidden.device)]
        total = (hidden * held.unsqueeze(-1)).sum(1)
        if self.sequence_parallel:
            total = reduce_from_tp(total, self.tp)
        if self.split_over_context:
            total = copy_to_tp(reduce_from_tp(total, self.cp), self.cp)
        return total / weights.sum(1, keepdim=True).clamp(min=1)

    def first_token_weight(self) -> float:
        """1.0, or 0.0 on CP ranks other than 0: how much of a loss on the first token this rank
        counts (every CP rank runs the same head on the same input; gradients are summed over
        CP, so only one may count it)."""
        return 1.0 if self.cp.rank == 0 else 0.0

    def rows_at(self, hidden: Tensor, positions: Tensor, seq_len: int) -> tuple[Tensor, Tensor]:
        """rows_at for this rank's rows."""
        return rows_at(hidden, positions, seq_len, self.tp, self.sequence_parallel, self.cp)

    def vocab_logits(self, hidden: Tensor, weight: Tensor) -> Tensor:
        """This rank's vocab shard of the logits [b, s, V/tp] of every held position of the
        whole CP chunk: under sequence parallelism the rows are all-gathered first (their
        gradient reduce-scattered back)."""
        if self.sequence_parallel:
            return sequence_gathered_linear(hidden, weight, None, self.tp)
        return F.linear(copy_to_tp(hidden, self.tp), weight)

    def key_mask(
        self,
        attention_mask: Tensor | None,
        *,
        causal: bool,
        position_ids: Tensor | None = None,
    ) -> Tensor | None:
        """The blocks' attention mask from a [b, s] padding mask (1 = token): bool [b, 1, 1, s],
        and for a causal model [b, 1, s, s] with the causal part (None: no padding, attention
        applies causality itself). Under context parallelism the key padding alone: ring
        attention builds the causal part from positions. Packed documents (`position_ids`
        [b, s] restarting at 0 per document): [b, 1, s, s], each query over its own document."""
        if position_ids is not None:
            if self.split_over_context:
                raise ValueError(
                    "packed documents (data.pack=true) run without context parallelism: ring "
                    "attention takes a key padding mask, not a document mask"
                )
            return document_mask(position_ids, attention_mask, causal=causal)
        if attention_mask is None:
            return None
        padding = attention_mask.bool()[:, None, None, :]
        if not causal or self.split_over_context:
            return padding
        s = attention_mask.shape[1]
        lower = torch.ones(s, s, dtype=torch.bool, device=attention_mask.device).tril()
        return lower[None, None] & padding

    def held_positions(self, position_ids: Tensor) -> Tensor:
        """Packed documents: the in-document positions [b, rows] of the rows this rank holds
        (the learned position embeddings' indices)."""
        return position_ids[:, self.positions(position_ids.shape[1], position_ids.device)]

    def next_token_targets(self, logits: Tensor, labels: Tensor) -> tuple[Tensor, Tensor]:
        """(logits [N, V/tp], targets [N]) for next-token prediction: labels [b, s] of the whole
        sequence, aligned with the inputs. Each position predicts the next token, the last one
        nothing (its target ignored, so the logits stay one contiguous view: no copy of
        [b, s - 1, V/tp] and none of its gradient). Under context parallelism the targets are
        this CP rank's positions of the shifted whole sequence (its logits are of those)."""
        targets = self.context_part(F.pad(labels[:, 1:], (0, 1), value=-100)).reshape(-1)
        return logits.reshape(-1, logits.shape[-1]), targets

    def mark_replicated(self, *modules: nn.Module) -> None:
        """Mark parameters that act on sequence-split rows (their TP gradients are summed):
        the modules outside the tensor-parallel regions, under sequence parallelism."""
        if self.sequence_parallel:
            mark_sequence_parallel(*modules)


def sequence_rows(ctx: ParallelContext) -> SequenceRows:
    return SequenceRows(ctx.tp, ctx.sequence_parallel, ctx.cp)
