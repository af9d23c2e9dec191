"""Facts about this machine: its GPUs, the low precisions each can run, and Transformer Engine.

Everything heavy (torch, Transformer Engine) is imported inside the functions, so importing this
module costs nothing and works on any machine. Used by `solrl doctor` (solrl_core/doctor/).

Precisions, as the explore (Stage-1) copy would use them:
- ``nvfp4``: real NVFP4 GEMMs through torchao's NVFP4Tensor and ``torch._scaled_mm`` on float4
  (solrl_core/precision/nvfp4_gemm.py). Needs compute capability >= 10.0 (Blackwell) AND torchao
  installed (Transformer Engine is still detected and reported, not used).
- ``fp8``: real FP8 (E4M3) GEMMs through torch's own ``torch._scaled_mm`` (solrl_core/precision/fp8.py);
  needs compute capability >= 8.9 (Ada, Hopper and newer) and nothing beyond torch.
- ``nvfp4-emulated``: solrl's exact NVFP4 emulation in plain torch (solrl_core/precision/nvfp4.py): anywhere.
- ``fp8-e5m2-tensor``: per-tensor FP8 E5M2, each tensor at its own amax (precision/e5m2.py), emulated: anywhere.
- ``fp8-e5m2-delayed``: the official explore copy's recipe exactly, Transformer Engine's delayed-scaled
  per-tensor FP8 E5M2 (precision/e5m2_delayed.py), emulated: anywhere (torch has no E5M2 x E5M2 GEMM).
- ``bf16``: on a GPU of compute capability >= 8.0 (Ampere), or on the CPU.
- ``fp32``: anywhere.

Transformer Engine's availability API moved between releases, so it is probed over the names each
release has (first found wins), all returning ``(supported, reason)``:
``transformer_engine.pytorch.is_nvfp4_available(return_reason=True)`` /
``is_fp8_available(return_reason=True)`` (TE 2.x top level, defined in ``pytorch/quantization.py``),
``transformer_engine.pytorch.quantization.check_nvfp4_support()`` / ``check_fp8_support()``,
``transformer_engine.pytorch.fp8.check_nvfp4_support()`` / ``check_fp8_support()`` (older layout),
and ``FP8GlobalStateManager.is_nvfp4_available()`` / ``is_fp8_available()`` in either module.
TE answers for the current CUDA device and caches the answer per process.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.metadata
import importlib.util
import sys
from dataclasses import dataclass
from typing import Callable, NamedTuple

PRECISIONS = ("nvfp4", "fp8", "nvfp4-emulated", "fp8-e5m2-tensor", "fp8-e5m2-delayed", "bf16", "fp32")
E5M2_TENSOR = "per-tensor FP8 E5M2 at each tensor's own amax, emulated in torch, runs anywhere"
E5M2_DELAYED = ("the official explore copy's recipe (Transformer Engine's delayed-scaled per-tensor FP8 E5M2), "
                "emulated in torch, runs anywhere")
NVFP4_CC = (10, 0)
FP8_CC = (8, 9)
BF16_CC = (8, 0)
TE_INSTALL = "pip install transformer-engine[pytorch] on a CUDA machine"
FP8_BACKENDS = ("scaled_mm", "torchao")  # explore.fp8_backend: the kernel of fp8 (precision/backends.py)
NVFP4_EMULATIONS = ("exact", "torchao")  # explore.nvfp4_emulation: nvfp4-emulated's GEMM order (precision/backends.py)


@dataclass(frozen=True)
class GpuInfo:
    index: int
    name: str
    capability: tuple[int, int]
    memory_gib: float

    def describe(self) -> str:
        return (f"cuda:{self.index} {self.name}, compute capability {self.capability[0]}.{self.capability[1]}, "
                f"{self.memory_gib:.0f} GiB")


class TEStatus(NamedTuple):
    installed: bool
    version: str | None
    reason: str  # why it is missing, or '' when installed


def gpus() -> list[GpuInfo]:
    """The CUDA GPUs torch can see (none on a CPU-only machine or build)."""
    import torch

    if not torch.cuda.is_available():
        return []
    out = []
    for i in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(i)
        out.append(GpuInfo(i, props.name, (props.major, props.minor), props.total_memory / 2**30))
    return out


def transformer_engine_status() -> TEStatus:
    """Whether Transformer Engine's PyTorch part imports here, its version, and why not if it does not."""
    import torch

    if _find_spec("transformer_engine") is None:
        if torch.version.cuda is None:
            return TEStatus(False, None, "not installed; it needs CUDA (this torch is a CPU-only build): "
                                         f"{TE_INSTALL}")
        if not torch.cuda.is_available():
            return TEStatus(False, None, f"not installed; it needs CUDA and a GPU, and this machine has no GPU: "
                                         f"{TE_INSTALL}")
        return TEStatus(False, None, f"not installed: {TE_INSTALL}")
    try:
        import transformer_engine  # noqa: F401
        import transformer_engine.pytorch  # noqa: F401
    except Exception as exc:  # noqa: BLE001 - ImportError, or OSError/RuntimeError from its CUDA libraries
        return TEStatus(False, _te_version(),
                        f"installed but does not import: {type(exc).__name__}: {_first_line(exc)}")
    return TEStatus(True, _te_version(), "")


def _find_spec(name: str) -> object | None:
    try:
        return importlib.util.find_spec(name)
    except (ImportError, ValueError):  # ValueError: a module in sys.modules without a spec
        return sys.modules.get(name)


def _te_version() -> str | None:
    module = sys.modules.get("transformer_engine")
    version = getattr(module, "__version__", None)
    if version:
        return str(version)
    for dist in ("transformer_engine", "transformer-engine", "transformer_engine_torch", "transformer-engine-cu12"):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


# (module, dotted attribute, takes return_reason) in the order they are tried; see the module docstring.
_TE_CHECKS = {
    "nvfp4": (("transformer_engine.pytorch", "is_nvfp4_available", True),
              ("transformer_engine.pytorch.quantization", "check_nvfp4_support", False),
              ("transformer_engine.pytorch.fp8", "check_nvfp4_support", False),
              ("transformer_engine.pytorch.quantization", "FP8GlobalStateManager.is_nvfp4_available", False),
              ("transformer_engine.pytorch.fp8", "FP8GlobalStateManager.is_nvfp4_available", False)),
    "fp8": (("transformer_engine.pytorch", "is_fp8_available", True),
            ("transformer_engine.pytorch.quantization", "check_fp8_support", False),
            ("transformer_engine.pytorch.fp8", "check_fp8_support", False),
            ("transformer_engine.pytorch.quantization", "FP8GlobalStateManager.is_fp8_available", False),
            ("transformer_engine.pytorch.fp8", "FP8GlobalStateManager.is_fp8_available", False)),
}


def te_support(kind: str, gpu: GpuInfo | None) -> tuple[bool, str] | None:
    """Transformer Engine's own answer for `kind` ('nvfp4' or 'fp8') on `gpu`: (supported, reason).
    None when TE is not importable or none of the known check functions exists."""
    if gpu is None or not transformer_engine_status().installed:
        return None
    import torch

    # TE asks about the current device; a CPU-only torch (tests with a stand-in TE) has none to set.
    on_gpu = torch.cuda.device(gpu.index) if torch.cuda.is_available() else contextlib.nullcontext()
    for module_name, attr, takes_reason in _TE_CHECKS[kind]:
        fn = _resolve(module_name, attr)
        if fn is None:
            continue
        try:
            with on_gpu:
                answer = fn(return_reason=True) if takes_reason else fn()
        except Exception as exc:  # noqa: BLE001 - a broken TE install is an answer too
            return False, f"Transformer Engine's {attr}() failed: {type(exc).__name__}: {_first_line(exc)}"
        if isinstance(answer, tuple):
            return bool(answer[0]), str(answer[1]) if len(answer) > 1 else ""
        return bool(answer), ""
    return None


def _resolve(module_name: str, attr: str) -> Callable | None:
    try:
        obj = importlib.import_module(module_name)
    except Exception:  # noqa: BLE001
        return None
    for part in attr.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj if callable(obj) else None


def explore_precisions(gpu: GpuInfo | None, torchao_missing: Callable[[], str] | None = None) -> dict[str,
                                                                                                      tuple[bool, str]]:
    """Which explore precisions run on `gpu` (None: the CPU), each with why or why not.

    `torchao_missing` says why torchao's NVFP4 tensor cannot be used ('' when it can; default: this
    machine's answer, nvfp4_gemm.torchao_missing); a parameter so the rules can be tested with made-up GPUs."""
    from solrl_core.precision import nvfp4_gemm

    missing = (torchao_missing
               or nvfp4_gemm.torchao_missing)() if gpu is not None and gpu.capability >= NVFP4_CC else ""
    out: dict[str, tuple[bool, str]] = {}
    if gpu is None:
        out["nvfp4"] = (False, "no GPU: NVFP4 GEMMs need an NVIDIA GPU of compute capability >= 10.0 (Blackwell)")
        out["fp8"] = (False, "no GPU: FP8 GEMMs need an NVIDIA GPU of compute capability >= 8.9 (Ada, Hopper)")
        out["nvfp4-emulated"] = (True, "exact NVFP4 emulation in torch, runs anywhere")
        out["fp8-e5m2-tensor"] = (True, E5M2_TENSOR)
        out["fp8-e5m2-delayed"] = (True, E5M2_DELAYED)
        out["bf16"] = (True, "bf16 on the CPU")
        out["fp32"] = (True, "always")
        return out
    cc = f"{gpu.capability[0]}.{gpu.capability[1]}"
    if gpu.capability < NVFP4_CC:
        out["nvfp4"] = (False, f"compute capability {cc} < 10.0: NVFP4 GEMMs need Blackwell (B200, GB200)")
    elif missing:
        out["nvfp4"] = (False, f"compute capability {cc} is enough, but {missing}")
    else:
        out["nvfp4"] = (True, "NVFP4 GEMMs through torchao's NVFP4Tensor (torch._scaled_mm on float4)")
    if gpu.capability < FP8_CC:
        out["fp8"] = (False, f"compute capability {cc} < 8.9: FP8 GEMMs need Ada or Hopper and newer")
    else:
        out["fp8"] = (True, "FP8 e4m3 GEMMs through torch._scaled_mm")
    out["nvfp4-emulated"] = (True, "exact NVFP4 emulation in torch, runs anywhere")
    out["fp8-e5m2-tensor"] = (True, E5M2_TENSOR)
    out["fp8-e5m2-delayed"] = (True, E5M2_DELAYED)
    out["bf16"] = ((True, f"compute capability {cc}") if gpu.capability >= BF16_CC
                   else (False, f"compute capability {cc} < 8.0: no native bf16 (Ampere and newer)"))
    out["fp32"] = (True, "always")
    return out


def supported(precisions: dict[str, tuple[bool, str]]) -> list[str]:
    return [name for name, (ok, _) in precisions.items() if ok]


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


# Explore-copy precisions this version of solrl runs (precision/backends.py: through which kernel).
IMPLEMENTED_EXPLORE = ("nvfp4", "fp8", "nvfp4-emulated", "fp8-e5m2-tensor", "fp8-e5m2-delayed", "bf16", "fp32")


FULL_PRECISIONS = ("bf16", "fp32")  # a run dtype: an explore copy at one quantizes nothing


def _gpu_of_device(device: object) -> GpuInfo | None:
    import torch

    dev = torch.device(device)  # type: ignore[arg-type]
    if dev.type != "cuda":
        return None
    index = dev.index if dev.index is not None else torch.cuda.current_device()
    return next((g for g in gpus() if g.index == index), None)


# Not a calibration candidate: the official recipe's numerics, for reproducing it, at fp8-e5m2-tensor's cost
REPRODUCTION_ONLY = ("fp8-e5m2-delayed",)


def runnable_low_precisions(device: object) -> list[str]:
    """The low (quantized) explore precisions this version runs on `device`: on a CPU the emulated
    ones, on a GPU of compute capability >= 8.9 real fp8 too (explore.calibrate=steps+precision's candidates)."""
    return [p for p in supported(explore_precisions(_gpu_of_device(device)))
            if p in IMPLEMENTED_EXPLORE and p not in FULL_PRECISIONS and p not in REPRODUCTION_ONLY]


def require_explore_precision(precision: str, device: object) -> None:
    """Refuse an explore precision this machine, or this version, cannot run; name what would work."""
    from solrl_core.errors import SolrlError

    gpu = _gpu_of_device(device)
    precisions = explore_precisions(gpu)
    if precision not in precisions:
        raise SolrlError(f"unknown explore precision '{precision}'", f"choose one of: auto, {', '.join(precisions)}")
    ok, why = precisions[precision]
    works = [p for p in supported(precisions) if p in IMPLEMENTED_EXPLORE]
    where = gpu.describe() if gpu else "the CPU"
    if not ok:
        raise SolrlError(f"explore precision {precision} does not run on {where}: {why}",
                         f"this machine supports: {', '.join(works)}; use --explore-precision {works[0]}")
