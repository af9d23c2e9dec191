"""What a run starts on, recorded in its start event so that a replay (`solrl monitor` on a finished
run) shows the machine the run used, not the one replaying it.

`describe` returns plain data (JSON-ready): each GPU with its compute capability and the explore
precisions it supports, what the requested explore precision resolved to, Transformer Engine and
torchao with their own availability answers, library versions, and the peak-memory ESTIMATE of
`solrl doctor` (the measured peaks travel in the iteration events).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import platform
from typing import Any

from solrl_core.precision import hardware

LIBRARIES = ("torch", "diffusers", "transformers", "peft", "torchao", "transformer_engine", "solrl")


def describe(cfg: Any, device: Any, dtype_name: str, explore_precision: str, machine: Any = None) -> dict[str, Any]:
    """The environment of a run on `device` (a torch.device) whose explore copy resolved to `explore_precision`,
    with what the auto switches chose there (`machine`, a plan.MachinePlan) when given."""
    import torch

    gpus = hardware.gpus()
    run_gpu = None
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        run_gpu = next((g for g in gpus if g.index == index), None)
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch_cuda": torch.version.cuda,  # None: a CPU-only build
        "libraries": {name: _version(name) for name in LIBRARIES},
        "device": str(device),
        "gpus": [{"index": g.index, "name": g.name, "capability": f"{g.capability[0]}.{g.capability[1]}",
                  "memory_gib": round(g.memory_gib, 2), "run": g == run_gpu,
                  "precisions": {k: list(v) for k, v in hardware.explore_precisions(g).items()}} for g in gpus],
        "cpu_precisions": {k: list(v) for k, v in hardware.explore_precisions(None).items()} if run_gpu is None
            else None,
        "explore": {"requested": cfg.explore.precision, "resolved": explore_precision, "full_precision": dtype_name,
                    "implemented": list(hardware.IMPLEMENTED_EXPLORE),
                    "why": machine.explore_why if machine is not None else ""},
        "machine": machine.describe() if machine is not None else "",
        "transformer_engine": _transformer_engine(run_gpu),
        "torchao": _torchao(),
        "memory_estimate_gib": _memory_estimate(cfg, run_gpu, explore_precision, dtype_name, machine),
    }


def _version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None  # Transformer Engine's own version, from its module, is under "transformer_engine"


def _transformer_engine(gpu: hardware.GpuInfo | None) -> dict[str, Any]:
    status = hardware.transformer_engine_status()
    out: dict[str, Any] = {"installed": status.installed, "version": status.version, "reason": status.reason}
    for kind in ("nvfp4", "fp8"):  # TE's own answer for the run's GPU (None: no GPU, or no check function in it)
        answer = hardware.te_support(kind, gpu) if status.installed else None
        out[kind] = list(answer) if answer is not None else None
    return out


def _torchao() -> dict[str, Any]:
    """torchao's own answers to whether this GPU runs its FP8 (sm >= 8.9) and NVFP4/MX (sm >= 10.0) kernels."""
    if importlib.util.find_spec("torchao") is None:
        return {"installed": False, "version": None, "reason": "not installed (pip install torchao)"}
    try:
        utils = importlib.import_module("torchao.utils")
    except Exception as exc:  # noqa: BLE001 - a broken install is an answer too
        return {"installed": False, "version": _version("torchao"), "reason": f"does not import: {type(exc).__name__}: "
                                                                              f"{exc}"}
    out: dict[str, Any] = {"installed": True, "version": _version("torchao"), "reason": ""}
    for key, fn in (("sm_at_least_89", "is_sm_at_least_89"), ("sm_at_least_100", "is_sm_at_least_100")):
        check = getattr(utils, fn, None)
        out[key] = bool(check()) if callable(check) else None
    return out


def _memory_estimate(cfg: Any, gpu: hardware.GpuInfo | None, explore_precision: str, dtype_name: str,
                     machine: Any) -> float | None:
    if gpu is None:
        return None
    from solrl_core.plan.footprint import estimate_memory

    copies = {} if machine is None else {"checkpointing": machine.checkpointing, "rollout_copy": machine.rollout_copy,
                                         "compiled_update": machine.update_compile}
    return round(estimate_memory(cfg, explore_precision, dtype_name, **copies).peak, 2)


if __name__ == "__main__":  # python -m solrl_core.plan.environment: what a run here would record
    import json

    import torch

    from solrl_core.config.schema import Config

    print(json.dumps(describe(Config(), torch.device("cpu"), "fp32", "nvfp4-emulated"), indent=2))
