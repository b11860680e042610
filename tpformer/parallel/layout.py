"""Pure layout arithmetic: no process groups, no torch.distributed calls.

Everything here is checked before the first collective, so a bad layout fails with a
message that names the values instead of hanging a rank.
"""

from __future__ import annotations

from dataclasses import dataclass


def divisors(n: int) -> list[int]:
    """All positive divisors of n, ascending (used in error messages)."""
    return [d for d in range(1, n + 1) if n % d == 0]


def divide(numerator: int, denominator: int, *, what: str = "value") -> int:
    """numerator // denominator, raising a ValueError that names both when it is not exact."""
    if denominator < 1:
        raise ValueError(f"cannot split {what}={numerator} into {denominator} parts")
    if numerator % denominator != 0:
        raise ValueError(
            f"{what}={numerator} is not divisible by tp={denominator}; "
            f"valid tp degrees for it are {divisors(numerator)}"
        )
    return numerator // denominator


def pad_to_multiple(n: int, multiple: int) -> int:
    """Smallest multiple of `multiple` that is >= n."""
    return -(-n // multiple) * multiple


def shard_range(size: int, parts: int, index: int) -> tuple[int, int]:
    """[start, stop) of chunk `index` when `size` is split into `parts` equal chunks."""
    chunk = divide(size, parts, what="size")
    return index * chunk, (index + 1) * chunk


@dataclass(frozen=True)
class Layout:
    """World = pp x dp x tp; TP ranks are adjacent, PP outermost
    (global rank = (pp_rank * dp + dp_rank) * tp + tp_rank), as in Megatron.

    Adjacent TP ranks keep a TP group inside one node, where the bandwidth is; pipeline stages,
    which exchange only one activation per micro-batch, are the ones that cross nodes.
    """

    dp: int
    tp: int
    pp: int = 1

    @property
    def world_size(self) -> int:
        return self.pp * self.dp * self.tp

    def rank_of(self, pp: int, dp: int, tp: int) -> int:
        return (pp * self.dp + dp) * self.tp + tp

    def tp_groups(self) -> list[list[int]]:
        """Global ranks of each TP group (one group per stage and DP replica)."""
        return [
            [self.rank_of(p, d, t) for t in range(self.tp)]
            for p in range(self.pp)
            for d in range(self.dp)
        ]

    def dp_groups(self) -> list[list[int]]:
        """Global ranks of each DP group (one group per stage and TP rank)."""
        return [
            [self.rank_of(p, d, t) for d in range(self.dp)]
            for p in range(self.pp)
            for t in range(self.tp)
        ]

    def pp_groups(self) -> list[list[int]]:
        """Global ranks of each pipeline, stage by stage (one per DP replica and TP rank)."""
        return [
            [self.rank_of(p, d, t) for p in range(self.pp)]
            for d in range(self.dp)
            for t in range(self.tp)
        ]

    def coords(self, rank: int) -> tuple[int, int]:
        """(dp_rank, tp_rank) of a global rank."""
        return divmod(rank % (self.dp * self.tp), self.tp)

    def stage_of(self, rank: int) -> int:
        """The pipeline stage (pp rank) of a global rank."""
        return rank // (self.dp * self.tp)


def resolve_layout(tensor: int, data: int | str, world_size: int, pipeline: int = 1) -> Layout:
    """Turn parallel.tensor / data (int or "auto") / pipeline into a Layout for this world size."""
    if tensor < 1:
        raise ValueError(f"parallel.tensor={tensor} must be >= 1")
    if pipeline < 1:
        raise ValueError(f"parallel.pipeline={pipeline} must be >= 1")
    model = tensor * pipeline
    factors = f"parallel.tensor={tensor}" + (
        f" x parallel.pipeline={pipeline}" if pipeline > 1 else ""
    )
    if world_size % model != 0:
        what = factors + (f" = {model}" if pipeline > 1 else "")
        valid = "valid values are" if pipeline == 1 else "valid products are"
        raise ValueError(
            f"{what} does not divide world_size={world_size}; {valid} {divisors(world_size)}"
        )
    if data == "auto":
        return Layout(dp=world_size // model, tp=tensor, pp=pipeline)
    if isinstance(data, str):
        if not data.isdigit():
            raise ValueError(f"parallel.data={data!r} must be a positive integer or 'auto'")
        data = int(data)
    if data < 1 or data * model != world_size:
        raise ValueError(
            f"parallel.data={data} x {factors} = {data * model} must equal "
            f"world_size={world_size}; use parallel.data=auto (= {world_size // model})"
        )
    return Layout(dp=data, tp=tensor, pp=pipeline)
