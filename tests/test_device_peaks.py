"""The MFU's denominator per SKU: device names as torch.cuda.get_device_name() reports them
pick their datasheet row (an H100 PCIe or NVL is not priced as the SXM part), and the loop's
modules price MFU without importing the planner."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tpformer.device_peaks import device_peak, peak_tflops


@pytest.mark.parametrize(
    ("name", "sms", "sku"),
    [
        ("NVIDIA H100 80GB HBM3", 132, "H100 SXM"),
        ("NVIDIA H100 PCIe", 114, "H100 PCIe"),
        ("NVIDIA H100", 114, "H100 PCIe"),
        ("NVIDIA H100 NVL", 132, "H100 NVL"),
        ("NVIDIA H200", 132, "H200 SXM"),
        ("NVIDIA H200 NVL", 132, "H200 NVL"),
        ("NVIDIA A100-SXM4-80GB", 108, "A100"),
        ("NVIDIA A100-PCIE-40GB", 108, "A100"),
        ("NVIDIA L40S", 142, "L40S"),
        ("NVIDIA L4", 58, "L4"),
    ],
)
def test_each_sku_gets_its_own_peak(name: str, sms: int, sku: str) -> None:
    peak = device_peak(name, sms)
    assert peak is not None and peak.sku == sku


def test_unknown_devices_have_no_peak() -> None:
    assert device_peak("NVIDIA L40", 142) is None and device_peak("Tesla T4", 40) is None
    assert peak_tflops("Tesla T4", 40, "bf16") == 0.0
    assert peak_tflops("NVIDIA H100 PCIe", 114, "fp32") == 51.0


def test_the_loop_does_not_import_the_planner() -> None:
    train = Path(__file__).resolve().parents[1] / "tpformer" / "train"
    for name in ("loop.py", "step_log.py", "metrics.py", "checkpointing.py", "profiling.py"):
        tree = ast.parse((train / name).read_text())
        modules = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        assert not any(m and m.startswith("tpformer.planner") for m in modules), name
