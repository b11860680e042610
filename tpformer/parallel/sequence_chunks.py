"""Which positions of a sequence each context-parallel (CP) rank holds.

The sequence is cut into 2 x cp equal chunks and CP rank r holds chunks r and 2cp - 1 - r (the
mirrored layout of Megatron-core and torchtitan). Under a causal mask the work of a query grows
with its position, so pairing an early chunk with a late one gives every rank the same number
of unmasked (query, key) pairs; a padding-only mask (BERT) does not need it, but one layout for
both keeps checkpoints, dropout keys and the loss bookkeeping the same for every model.
"""

from __future__ import annotations

import torch
from torch import Tensor


def check_context_length(seq_len: int, cp: int) -> None:
    """A sequence must split into 2 x cp equal chunks."""
    if cp > 1 and seq_len % (2 * cp) != 0:
        below = seq_len - seq_len % (2 * cp)
        raise ValueError(
            f"sequence length {seq_len} is not divisible by 2 x parallel.context = {2 * cp} "
            f"(each CP rank holds two mirrored chunks); use e.g. {below or 2 * cp} or "
            f"{below + 2 * cp}"
        )


def context_positions(seq_len: int, cp_rank: int, cp: int, device: torch.device) -> Tensor:
    """The global positions CP rank `cp_rank` holds, ascending: [seq_len / cp] (all of them when
    cp == 1)."""
    if cp == 1:
        return torch.arange(seq_len, device=device)
    check_context_length(seq_len, cp)
    chunk = seq_len // (2 * cp)
    first = torch.arange(cp_rank * chunk, (cp_rank + 1) * chunk, device=device)
    mirror = 2 * cp - 1 - cp_rank
    second = torch.arange(mirror * chunk, (mirror + 1) * chunk, device=device)
    return torch.cat([first, second])


def causal_block(local_len: int, cp_rank: int, src: int) -> tuple[int, int]:
    """(first query row, key columns) of CP rank `cp_rank`'s queries against rank `src`'s keys
    that a causal mask leaves anything to, in the mirrored layout: its own block whole; an
    earlier rank's first chunk only (its second chunk lies after both of this rank's chunks);
    a later rank's keys from this rank's second chunk only (both its chunks lie after this
    rank's first). Each skipped half is all future: half of every off-diagonal block."""
    half = local_len // 2
    if src == cp_rank:
        return 0, local_len
    return (0, half) if src < cp_rank else (half, local_len)


def within_reach(local_len: int, cp: int, cp_rank: int, src: int, reach: int) -> bool:
    """Whether any query of CP rank `cp_rank` lies at most `reach` positions from a key of rank
    `src` (sliding-window attention), in the mirrored layout: chunks a and b (of local_len / 2
    positions each) come no closer than (|a - b| - 1) x chunk + 1 positions. Host arithmetic,
    so ring attention skips a block out of reach without reading the device."""
    if reach <= 0 or src == cp_rank:
        return True
    chunk = local_len // 2
    mine, theirs = (cp_rank, 2 * cp - 1 - cp_rank), (src, 2 * cp - 1 - src)
    return any((abs(a - b) - 1) * chunk + 1 <= reach for a in mine for b in theirs)
