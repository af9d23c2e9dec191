"""The device's dense peak FLOP/s at a precision: the vendor's datasheet figure for the GPUs below,
else a GEMM throughput measured here (any other GPU, and the CPU).

Datasheet figures are dense (without 2:4 structured sparsity, which the vendors' headline numbers
double), tensor-core, FP32 accumulate (what torch's bf16 matmul and fp8 `_scaled_mm` use), TFLOPS:

    A100 (SXM, PCIe)     bf16 312                               NVIDIA A100 datasheet
    H100 SXM             bf16 989,  fp8 1979                    NVIDIA H100 datasheet
    H100 PCIe            bf16 756,  fp8 1513                    NVIDIA H100 datasheet
    H100 NVL             bf16 835,  fp8 1671                    NVIDIA H100 datasheet
    H200 (SXM)           bf16 989,  fp8 1979                    NVIDIA H200 datasheet
    H200 NVL             bf16 835,  fp8 1671                    NVIDIA H200 datasheet
    B200 (HGX, 1000 W)   bf16 2250, fp8 4500, fp4 9000          NVIDIA HGX B200 datasheet, per GPU
    L40S                 bf16 362,  fp8 733                     NVIDIA L40S datasheet
    RTX 4090             bf16 165,  fp8 330                     NVIDIA Ada Lovelace architecture whitepaper
    RTX 5090             bf16 209.5, fp8 419, fp4 1676          NVIDIA RTX Blackwell architecture whitepaper
                         (fp4: 3352 AI TOPS sparse / 2; GeForce halves the FP32-accumulate rate of bf16 and fp8)

fp4 only where the hardware has it (Blackwell). A precision the table lacks for a listed GPU (fp32,
fp8 on an A100) is measured, as on any other device.
"""

from __future__ import annotations

import os
import platform
import time
from dataclasses import dataclass
from pathlib import Path

import torch

# (name fragments that must all appear in torch.cuda.get_device_name, label, {precision: dense TFLOPS}); first match
# wins
TABLE: tuple[tuple[tuple[str, ...], str, dict[str, float]], ...] = (
    (("A100",), "A100", {"bf16": 312.0}),
    (("H100", "PCIe"), "H100 PCIe", {"bf16": 756.0, "fp8": 1513.0}),
    (("H100", "NVL"), "H100 NVL", {"bf16": 835.0, "fp8": 1671.0}),
    (("H100",), "H100 SXM", {"bf16": 989.0, "fp8": 1979.0}),
    (("H200", "NVL"), "H200 NVL", {"bf16": 835.0, "fp8": 1671.0}),
    (("H200",), "H200 SXM", {"bf16": 989.0, "fp8": 1979.0}),
    (("B200",), "B200", {"bf16": 2250.0, "fp8": 4500.0, "fp4": 9000.0}),
    (("L40S",), "L40S", {"bf16": 362.0, "fp8": 733.0}),
    (("4090",), "RTX 4090", {"bf16": 165.0, "fp8": 330.0}),
    (("5090",), "RTX 5090", {"bf16": 209.5, "fp8": 419.0, "fp4": 1676.0}),
)
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32, "fp16": torch.float16}


@dataclass(frozen=True)
class Peak:
    """A dense peak rate and where it comes from."""

    flops: float  # FLOP/s
    precision: str
    source: str  # "datasheet: H100 SXM dense bf16" | "measured: 1024^3 fp32 GEMM, best of N"

    def to_dict(self) -> dict[str, object]:
        return {"tflops": self.flops / 1e12, "precision": self.precision, "source": self.source}


def datasheet_peak(device_name: str, precision: str) -> Peak | None:
    """The table's figure for a GPU whose name matches, at `precision`; None when not listed."""
    for fragments, label, figures in TABLE:
        if all(f in device_name for f in fragments):
            tflops = figures.get(precision)
            return Peak(tflops * 1e12, precision, f"datasheet: {label} dense {precision}") if tflops else None
    return None


def measure_gemm(device: torch.device, precision: str, seconds: float = 0.5, size: int | None = None) -> Peak | None:
    """The best FLOP/s of a square matmul at `precision` over about `seconds` (a short loop after a
    warm-up call): the rate this device reaches on the kind of work the model does. None for a
    precision this measure does not cover (fp8, fp4: no portable matmul)."""
    dtype = DTYPES.get(precision)
    if dtype is None:
        return None
    n = size or (8192 if device.type == "cuda" else 1024)
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    a @ b  # warm-up: kernel choice, thread pool start
    _sync(device)
    best, calls, start = 0.0, 0, time.perf_counter()
    while calls < 3 or time.perf_counter() - start < seconds:
        t0 = time.perf_counter()
        a @ b
        _sync(device)
        best = max(best, 2 * n**3 / (time.perf_counter() - t0))
        calls += 1
    return Peak(best, precision, f"measured: {n}x{n} {precision} GEMM, best of {calls}")


def device_peak(device: torch.device, precision: str,
                cache: dict[tuple[str, str], Peak | None] | None = None) -> Peak | None:
    """The datasheet peak of this GPU at `precision`, else a measured GEMM rate (once per device and
    precision when `cache` is given); None when neither is known."""
    key = (str(device), precision)
    if cache is not None and key in cache:
        return cache[key]
    found = datasheet_peak(torch.cuda.get_device_name(device), precision) if device.type == "cuda" else None
    found = found or measure_gemm(device, precision)
    if cache is not None:
        cache[key] = found
    return found


def device_label(device: str | torch.device) -> str:
    """'cuda:0 (NVIDIA H100 ...)' or 'cpu (x86_64, <CPU model>, N cores)': what every figure is labelled with."""
    d = torch.device(device)
    if d.type == "cuda":
        return f"{d} ({torch.cuda.get_device_name(d)})"
    info = Path("/proc/cpuinfo")
    names = [ln.split(":", 1)[1].strip() for ln in info.read_text().splitlines()
             if ln.startswith("model name")] if info.is_file() else []
    return (f"cpu ({platform.machine()}, {names[0] if names else platform.processor() or 'unknown model'}, "
            f"{os.cpu_count()} cores)")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
