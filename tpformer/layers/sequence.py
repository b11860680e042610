"""What the heads take from a sequence-sharded encoder output, with the fewest bytes, and which
positions a rank holds (sequence and context parallelism).

Under sequence parallelism the last layer leaves [b, s/tp, h] on each TP rank. The MLM head
needs only the masked positions (about 15%, given with the batch: `labeled_positions`), the
pooler only the first token; these helpers fetch exactly those rows and hand them out
replicated, as the heads expect. Without sequence parallelism they are plain indexing.
"""

from __future__ import annotations

import torch
from torch import Tensor

from tpformer.parallel.comm import from_first_rank, reduce_from_tp, sequence_range
from tpformer.parallel.context import GroupHandle
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


def context_part(x: Tensor, cp: GroupHandle) -> Tensor:
    """x [b, s, ...] of the whole sequence -> this CP rank's positions [b, s / cp, ...]."""
    if cp.size == 1:
        return x
    return x.index_select(1, context_positions(x.shape[1], cp.rank, cp.size, x.device))


def first_token(hidden: Tensor, tp: GroupHandle, sequence_parallel: bool) -> Tensor:
    """hidden[:, 0] of the whole sequence, replicated: one broadcast of [b, h] from the rank
    that holds position 0."""
    return from_first_rank(hidden[:, 0], tp) if sequence_parallel else hidden[:, 0]


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
