"""Keys that were renamed: an override with the old name gets one line naming the new one
(instead of Hydra's "key not in struct"), so a user's command from an older release says how
to fix itself; and a model config saved under the old names (a checkpoint's meta.json) is read
in the new ones."""

from __future__ import annotations

from typing import Any

RENAMED = {
    "parallel.activation_checkpointing": "parallel.recompute",
    "parallel.checkpoint_num_layers": "parallel.recompute_num_layers",
    "parallel.checkpoint_every": "parallel.recompute_every",
    "parallel.checkpoint_offload": "parallel.recompute_offload",
    "model.activation": "model.mlp.activation",
    "model.gated_mlp": "model.mlp.gated",
    "model.layer_norm_eps": "model.norm.eps",
    "model.rope_theta": "model.rotary.theta",
    "model.rope_scaling": "model.rotary.scaling",
    "model.rope_factor": "model.rotary.factor",
    "model.rope_original_max_positions": "model.rotary.original_max_positions",
    "model.rope_low_freq_factor": "model.rotary.low_freq_factor",
    "model.rope_high_freq_factor": "model.rotary.high_freq_factor",
    "model.local_rope_theta": "model.rotary.local_theta",
    "model.global_every": "model.local_attention.global_every",
}
"""Old key -> new key, the value unchanged. The parallel.checkpoint_* keys set activation
recomputation, not checkpoints (trainer.save_every and friends set those); the model's variant
keys moved into its groups (mlp, norm, rotary, local_attention)."""

WHY = {
    "parallel": "it sets activation recomputation",
    "model": "the model's variants are groups now: mlp, norm, rotary, local_attention",
}


def _new_override(key: str, value: str) -> str | None:
    """The override that replaces `key=value` when the old key's value decides the new key."""
    if key == "model.norm" and value and not value.startswith(("{", "null")):
        return f"model.norm.kind={value}"
    if key == "model.pre_norm":
        return "model.norm.position=" + ("pre" if value.lower() == "true" else "post")
    if key == "model.position_embedding":
        return "+model/rotary=on" if value == "rope" else "model.rotary=null"
    if key == "model.local_window":
        on = f"+model/local_attention=on model.local_attention.window={value}"
        return "model.local_attention=null" if value == "0" else on
    return None


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
        why = WHY.get(key.split(".")[0], "")
        if key in RENAMED:
            raise ValueError(
                f"{key} was renamed {RENAMED[key]} ({why}); "
                f"write {override.replace(key, RENAMED[key], 1)}"
            )
        new = _new_override(key, value)
        if new is not None:
            raise ValueError(f"{key} was replaced ({why}): write {new}")


def upgraded_model_keys(saved: dict[str, Any]) -> dict[str, Any]:
    """A model config as a checkpoint saved it, in today's keys: one saved before the variant
    groups (flat rope_*, local_window, norm, pre_norm, ...) is moved into them, the way the
    model it describes was built (its `bias` covered the norms too; a decoder is pre-norm)."""
    if "position_embedding" not in saved:
        return saved
    old = dict(saved)
    model = {k: v for k, v in old.items() if k not in _FLAT}
    model["mlp"] = {"activation": old["activation"], "gated": old.get("gated_mlp", False)}
    pre = old.get("pre_norm", False) or old["arch"] == "gpt"
    model["norm"] = {
        "kind": old.get("norm", "layernorm"),
        "eps": old["layer_norm_eps"],
        "bias": old.get("bias", True),
        "position": "pre" if pre else "post",
    }
    model["rotary"] = None
    if old["position_embedding"] == "rope":
        model["rotary"] = {new: old[flat] for flat, new in _ROTARY.items() if flat in old}
    window, every = old.get("local_window", 0), old.get("global_every", 1)
    model["local_attention"] = (
        {"window": window, "global_every": every} if window and every > 1 else None
    )
    return model


_ROTARY = {
    "rope_theta": "theta",
    "rope_scaling": "scaling",
    "rope_factor": "factor",
    "rope_original_max_positions": "original_max_positions",
    "rope_low_freq_factor": "low_freq_factor",
    "rope_high_freq_factor": "high_freq_factor",
    "local_rope_theta": "local_theta",
}
_FLAT = {
    *_ROTARY,
    "position_embedding",
    "activation",
    "gated_mlp",
    "norm",
    "layer_norm_eps",
    "pre_norm",
    "local_window",
    "global_every",
}
"""The flat keys of a model config saved before the variant groups."""
