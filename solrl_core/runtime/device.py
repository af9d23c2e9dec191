"""The run's device and full-precision dtype, resolved once from the config's "auto"."""

from __future__ import annotations

import torch

from solrl_core.errors import SolrlError


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError as exc:
        raise SolrlError(f"run.device '{name}' is not a device", "use auto, cpu, cuda or cuda:N") from exc
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SolrlError(f"run.device '{name}' asked for CUDA but torch sees no GPU", "use --device cpu, or install a "
                                                                                      "CUDA build of torch")
    return device


def resolve_dtype(name: str, device: torch.device) -> tuple[str, torch.dtype]:
    if name == "auto":
        name = "bf16" if device.type == "cuda" else "fp32"
    return name, {"bf16": torch.bfloat16, "fp32": torch.float32}[name]
