"""Compute dtypes, the blocks' fp8 matmuls and the dynamic loss scaler of fp16 training."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from tpformer.engine.units import model_blocks
from tpformer.parallel.context import ParallelContext
from tpformer.parallel.fp8_scaling import Fp8Scaling

DTYPES = {
    "fp32": torch.float32,
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
    "fp8": torch.bfloat16,
}
"""fp8: bf16 parameters and activations, the blocks' linear matmuls in fp8 (use_fp8_linears)."""


def compute_dtype(precision: str) -> torch.dtype:
    """The parameter/activation dtype of `precision` (fp32, bf16, fp16 or fp8)."""
    return DTYPES[precision]


def use_fp8_linears(model: nn.Module, ctx: ParallelContext) -> None:
    """Give every linear layer inside the model's blocks (a module with an `fp8` attribute:
    layers/linear.py) its fp8 scaling, amaxes reduced over TP and CP (the groups that shard
    its operands); embeddings, norms, heads and everything outside the blocks stay in the
    compute dtype, as in Megatron and torchtitan (the startup plan counts them:
    train/startup_report.matmul_line)."""
    scaling = Fp8Scaling(groups=(ctx.tp, ctx.cp))
    for block in model_blocks(model):
        for module in block.modules():
            if hasattr(type(module), "fp8"):
                setattr(module, "fp8", scaling)  # noqa: B010 (any module's attribute)


class LossScaler:
    """Dynamic loss scale: halve and skip on inf/nan, double after `window` clean steps.

    The scale and the count of clean steps are device tensors updated with device ops, so a
    step that overflows is decided without reading anything on the host. With enabled=False
    (fp32/bf16) the scale stays 1 and the engine counts only non-finite steps.
    """

    def __init__(
        self,
        *,
        enabled: bool,
        initial: float = 65536.0,
        window: int = 1000,
        device: torch.device | str = "cpu",
    ) -> None:
        self.enabled, self.window = enabled, window
        self.scale = torch.tensor(initial if enabled else 1.0, device=device)
        self.clean_steps = torch.zeros((), dtype=torch.long, device=device)

    def update(self, found_nonfinite: Tensor | bool) -> None:
        """After a step: `found_nonfinite` a bool device scalar (or a host bool, in tests)."""
        if not self.enabled:
            return
        bad = torch.as_tensor(found_nonfinite, device=self.scale.device)
        clean = self.clean_steps + 1
        full = clean >= self.window
        grown = torch.where(full, self.scale * 2.0, self.scale)
        self.scale = torch.where(bad, (self.scale / 2.0).clamp(min=1.0), grown)
        self.clean_steps = torch.where(bad | full, 0, clean)

    def state_dict(self) -> dict[str, float]:
        """Host numbers (read at a checkpoint, never inside a step)."""
        return {"scale": float(self.scale), "clean_steps": int(self.clean_steps)}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.scale = torch.full_like(self.scale, float(state["scale"]))
        self.clean_steps = torch.full_like(self.clean_steps, int(state["clean_steps"]))
