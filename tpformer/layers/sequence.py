"""What the heads take from a sequence-sharded encoder output, with the fewest bytes, and which
positions a rank holds (sequence and context parallelism).

Under sequence parallelism the last layer leaves [b, s/tp, h] on each TP rank. The MLM head
needs only the masked positions (about 15%), the pooler only the first token; these helpers
fetch exactly those rows and hand them out replicated, as the heads expect. Without sequence
parallelism they are plain indexing.
"""

from __future__ import annotations

import torch
from torch import Tensor

from tpformer.parallel.comm import from_first_rank, gather_rows, sequence_range
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


def labeled_rows(
    hidden: Tensor,
    labels: Tensor,
    tp: GroupHandle,
    sequence_parallel: bool,
    *,
    ignore_index: int = -100,
) -> tuple[Tensor, Tensor]:
    """(rows [N, h], their labels [N]) of every position whose label is not ignored, in the
    order of the flat [b * s] sequence, replicated. hidden is [b, s, h] or this rank's chunk
    [b, s/tp, h]; labels [b, s] are whole on every rank, so each rank knows every rank's count
    and one all-gather of the selected rows suffices."""
    b, s = labels.shape
    if not sequence_parallel or tp.size == 1:
        flat = labels.reshape(-1)
        picked = (flat != ignore_index).nonzero().squeeze(-1)
        rows = hidden.reshape(-1, hidden.shape[-1]).index_select(0, picked)
        return rows, flat.index_select(0, picked)
    local = s // tp.size
    by_rank = labels.reshape(b, tp.size, local).transpose(0, 1)  # [tp, b, s/tp]
    keep = by_rank != ignore_index
    counts = keep.flatten(1).sum(dim=1).tolist()
    mine = keep[tp.rank].reshape(-1).nonzero().squeeze(-1)
    rows = gather_rows(hidden.reshape(-1, hidden.shape[-1]).index_select(0, mine), counts, tp)
    # global flat index of every gathered row (rank-major), then back to the flat order
    positions = torch.arange(b * s, device=labels.device).reshape(b, tp.size, local).transpose(0, 1)
    global_index = positions[keep]
    order = global_index.argsort()
    flat = labels.reshape(-1)
    return rows.index_select(0, order), flat.index_select(0, global_index.index_select(0, order))
