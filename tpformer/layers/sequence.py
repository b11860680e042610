"""What the heads take from a sequence-sharded encoder output, with the fewest bytes.

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


def local_positions(
    seq_len: int, tp: GroupHandle, sequence_parallel: bool, device: torch.device
) -> Tensor:
    """The global positions this rank holds: all of them, or its chunk of the sequence."""
    if not sequence_parallel:
        return torch.arange(seq_len, device=device)
    start, stop = sequence_range(seq_len // tp.size, tp)
    return torch.arange(start, stop, device=device)


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
