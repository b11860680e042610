"""Typed schema of the Hydra groups. YAML holds values; these dataclasses hold types and defaults."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class ParallelConfig:
    """How the world is split and how randomness is keyed."""

    tensor: int = 1
    """TP degree: must divide the attention heads, hidden size and world size."""
    data: str = "auto"
    """DP degree, or "auto" = world_size / tensor."""
    seed: int = 1234
    """Seeds weight init and every dropout mask; masks do not depend on the layout."""
