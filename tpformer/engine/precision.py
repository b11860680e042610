"""Compute dtypes and the dynamic loss scaler of fp16 training."""

from __future__ import annotations

import torch

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def compute_dtype(precision: str) -> torch.dtype:
    """The parameter/activation dtype of `precision` (fp32, bf16 or fp16)."""
    return DTYPES[precision]


class LossScaler:
    """Dynamic loss scale: halve and skip on inf/nan, double after `window` clean steps.

    With enabled=False (fp32/bf16) the scale stays 1 and only non-finite steps are counted.
    """

    def __init__(self, *, enabled: bool, initial: float = 65536.0, window: int = 1000) -> None:
        self.enabled, self.window = enabled, window
        self.scale = initial if enabled else 1.0
        self.clean_steps = 0

    def update(self, found_nonfinite: bool) -> None:
        if not self.enabled:
            return
        if found_nonfinite:
            self.scale = max(self.scale / 2.0, 1.0)
            self.clean_steps = 0
            return
        self.clean_steps += 1
        if self.clean_steps >= self.window:
            self.scale *= 2.0
            self.clean_steps = 0

    def state_dict(self) -> dict[str, float]:
        return {"scale": self.scale, "clean_steps": self.clean_steps}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.scale, self.clean_steps = state["scale"], int(state["clean_steps"])
