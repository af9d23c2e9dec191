"""What every benchmark prints about the machine it measured on."""

from __future__ import annotations

import os
import platform
from pathlib import Path

import torch


def device_name(device: str | torch.device) -> str:
    """'cuda:0 (NVIDIA H100 ...)' or 'cpu (x86_64, <CPU model>, N cores)'."""
    d = torch.device(device)
    if d.type == "cuda":
        return f"{d} ({torch.cuda.get_device_name(d)})"
    info = Path("/proc/cpuinfo")
    names = [ln.split(":", 1)[1].strip() for ln in info.read_text().splitlines()
             if ln.startswith("model name")] if info.is_file() else []
    return f"cpu ({platform.machine()}, {names[0] if names else platform.processor() or 'unknown model'}, {os.cpu_count()} cores)"
