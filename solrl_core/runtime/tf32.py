"""TF32 for fp32 matmuls and convolutions on CUDA (`run.tf32`), set once when a command resolves its device.

The official Sol-RL base config and scripts turn TF32 on (configs/sol_rl/base.py:25; train_sana.py:583-585,
train_flux1.py:616-618, train_sd3.py:641-643, through the legacy `allow_tf32` flags). solrl sets the
matmul side with `torch.set_float32_matmul_precision`, which writes the new per-backend setting and the
generic one alike: setting `torch.backends.cuda.matmul.fp32_precision` alone makes the generic getter,
which Inductor's max-autotune reads, raise on a mix of the two APIs (torch 2.14). The cuDNN side keeps
`torch.backends.cudnn.allow_tf32`, which sets conv and RNN alike and is what Inductor's conv reads.
On a CPU nothing is set: a CPU run computes what it computed before the setting existed.
"""

from __future__ import annotations

import torch

MATMUL = {True: "high", False: "highest"}  # torch.set_float32_matmul_precision: high = TF32 tensor cores


def tf32_settings(enabled: bool, device: torch.device) -> dict[str, object]:
    """What `apply_tf32` sets for a run on `device`: nothing off CUDA."""
    if device.type != "cuda":
        return {}
    return {"float32_matmul_precision": MATMUL[enabled], "cudnn.allow_tf32": enabled}


def apply_tf32(enabled: bool, device: torch.device) -> dict[str, object]:
    """Set TF32 on or off for this process when `device` is CUDA; returns what was set ({} on a CPU)."""
    settings = tf32_settings(enabled, device)
    if settings:
        torch.set_float32_matmul_precision(str(settings["float32_matmul_precision"]))
        torch.backends.cudnn.allow_tf32 = bool(settings["cudnn.allow_tf32"])
    return settings


def describe_tf32(enabled: bool, device: torch.device) -> str:
    """The start-up line's words for the setting: '' on a CPU, where it sets nothing (the line stays as it was)."""
    if device.type != "cuda":
        return ""
    return ("TF32 on (fp32 matmuls and convolutions on tensor cores)" if enabled else "TF32 off (run.tf32=false: full "
                                                                                      "fp32)")
