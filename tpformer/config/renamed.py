"""Keys that were renamed: an override with the old name gets one line naming the new one
(instead of Hydra's "key not in struct"), so a user's command from an older release says how
to fix itself."""

from __future__ import annotations

RENAMED = {
    "parallel.activation_checkpointing": "parallel.recompute",
    "parallel.checkpoint_num_layers": "parallel.recompute_num_layers",
    "parallel.checkpoint_every": "parallel.recompute_every",
    "parallel.checkpoint_offload": "parallel.recompute_offload",
}
"""Old key -> new key. The parallel.checkpoint_* keys set activation recomputation, not
checkpoints (trainer.save_every and friends set those)."""


def check_renamed(overrides: list[str]) -> None:
    """Raise ValueError for the first override (key=value, +key=value, ~key) of a renamed key,
    or of a list given to parallel.pipeline_split (layers per stage: parallel.pipeline_layers)."""
    for override in overrides:
        key, _, value = override.lstrip("+~").partition("=")
        if key == "parallel.pipeline_split" and value.lstrip().startswith("["):
            raise ValueError(
                f"parallel.pipeline_split takes balanced, profile or pipedream; layers per "
                f"stage go in parallel.pipeline_layers: write parallel.pipeline_layers={value}"
            )
        if key in RENAMED:
            raise ValueError(
                f"{key} was renamed {RENAMED[key]} (it sets activation recomputation); "
                f"write {override.replace(key, RENAMED[key], 1)}"
            )
