"""How a tpformer parameter is assembled from Hugging Face tensors: one tensor (Plain), the
fused QKV of separate or [q|k|v] tensors (FusedQKV), a gated MLP's [unit, (gate, up)] rows
(GatedRows)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Plain:
    """One HF tensor; `transposed` for GPT-2's Conv1D ([in, out] instead of [out, in])."""

    key: str
    transposed: bool = False


@dataclass(frozen=True)
class FusedQKV:
    """Our per-head interleaved QKV from HF's q, k, v: three keys, or one [q|k|v] key."""

    keys: tuple[str, ...]
    transposed: bool = False


@dataclass(frozen=True)
class GatedRows:
    """Our [unit, (gate, up)] rows from HF's gate and up projections: two keys (Llama), or one
    [gate | up] key (ModernBERT's Wi: its first half is activated, the second multiplied).
    `block` rows per unit: grouped-query attention's key/value weight is [head, (k, v), d]
    from k_proj and v_proj (block = head_dim)."""

    keys: tuple[str, ...]
    block: int = 1


Rule = Plain | FusedQKV | GatedRows


def linear_rules(ours: str, theirs: str, transposed: bool = False) -> dict[str, Rule]:
    return {
        f"{ours}.weight": Plain(f"{theirs}.weight", transposed),
        f"{ours}.bias": Plain(f"{theirs}.bias"),
    }


def norm_rules(ours: str, theirs: str) -> dict[str, Rule]:
    return {f"{ours}.weight": Plain(f"{theirs}.weight"), f"{ours}.bias": Plain(f"{theirs}.bias")}
