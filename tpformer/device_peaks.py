"""Dense peak TFLOP/s of the accelerators tpformer reports MFU against, per SKU, from NVIDIA's
datasheets (dense, not the 2:4-sparse figures): the loop's MFU (trainer.peak_tflops=0) and
tools/gpu_check.py pick the row from the device's name and SM count; both take an explicit
peak instead where a device is not listed."""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class DevicePeak:
    sku: str
    bf16: float
    """Dense bf16/fp16 tensor-core TFLOP/s."""
    fp32: float
    """Non-tensor-core fp32 TFLOP/s."""
    names: tuple[str, ...]
    """Words of torch.cuda.get_device_name() that identify it (all must appear)."""
    sms: int = 0
    """Its SM count, where the name alone does not tell SKUs apart (0: not used)."""


PEAKS = (  # the most specific first
    DevicePeak("H100 NVL", 835.0, 60.0, ("H100", "NVL")),
    DevicePeak("H100 PCIe", 756.0, 51.0, ("H100", "PCIe")),
    DevicePeak("H100 PCIe", 756.0, 51.0, ("H100",), sms=114),
    DevicePeak("H100 SXM", 989.0, 67.0, ("H100",)),
    DevicePeak("H200 NVL", 835.0, 60.0, ("H200", "NVL")),
    DevicePeak("H200 SXM", 989.0, 67.0, ("H200",)),
    DevicePeak("A100", 312.0, 19.5, ("A100",)),
    DevicePeak("L40S", 362.0, 91.6, ("L40S",)),
    DevicePeak("L4", 121.0, 30.3, ("L4",)),
)


def device_peak(name: str, sms: int = 0) -> DevicePeak | None:
    """The datasheet row of a device called `name` (torch.cuda.get_device_name) with `sms`
    SMs (its multi_processor_count), or None for a device not listed. Fragments match whole
    words of the name (split at spaces and hyphens: "L4" is not "L40S")."""
    words = set(re.split(r"[\s\-]+", name))
    for peak in PEAKS:
        if set(peak.names) <= words and peak.sms in (0, sms):
            return peak
    return None


def peak_tflops(name: str, sms: int, precision: str) -> float:
    """Dense peak TFLOP/s for a run at `precision` (fp32, or a 16-bit one; fp8 runs are
    credited against the bf16 peak, as torchtitan reports them), 0 if unknown."""
    peak = device_peak(name, sms)
    if peak is None:
        return 0.0
    return peak.fp32 if precision == "fp32" else peak.bf16
