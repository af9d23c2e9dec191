"""The software stack: Python, torch and its CUDA build, the GPUs, Transformer Engine, the libraries
and the combinations known to break, and the reward backends."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import sys
import warnings

from solrl_core.config.schema import TINY_LOADERS, Config
from solrl_core.doctor.check import FAIL, PASS, WARN, Check, Machine
from solrl_core.precision import hardware
from solrl_core.precision.hardware import GpuInfo
from solrl_core.rewards.registry import backends, torchvision_rewards

MIN_PYTHON = (3, 10)


def _python() -> Check:
    v = sys.version_info
    ok = v[:2] >= MIN_PYTHON
    return Check("python", PASS if ok else FAIL, f"Python {v.major}.{v.minor}.{v.micro} ({sys.executable})",
                 "" if ok else f"solrl needs Python >= {MIN_PYTHON[0]}.{MIN_PYTHON[1]}", True)


def _torch(m: Machine) -> Check:
    import torch

    build = f"CUDA {torch.version.cuda} build" if torch.version.cuda else "CPU-only build"
    avail = f"CUDA available: yes, {len(m.gpus)} GPU(s)" if m.gpus else "CUDA available: no"
    return Check("torch", PASS, f"torch {torch.__version__}, {build}; {avail}", "", True)


def _device(cfg: Config, m: Machine) -> tuple[Check, GpuInfo | None]:
    import torch

    name = cfg.run.device
    real = cfg.model.loader not in TINY_LOADERS
    if name == "auto":
        name = "cuda:0" if m.gpus else "cpu"
    try:
        device = torch.device(name)
    except RuntimeError:
        return Check("run device", FAIL, f"run.device '{cfg.run.device}' is not a device", "use auto, cpu, cuda or "
                                                                                           "cuda:N",
                     True), None
    if device.type == "cuda":
        index = device.index or 0
        if not m.gpus:
            return Check("run device", FAIL, f"run.device {cfg.run.device} asks for CUDA, but torch sees no GPU",
                         "use --device cpu, or run on a machine with an NVIDIA GPU and a CUDA build of torch",
                         True), None
        if index >= len(m.gpus):
            return Check("run device", FAIL, f"run.device {cfg.run.device}: this machine has {len(m.gpus)} GPU(s)",
                         f"choose one of cuda:0..cuda:{len(m.gpus) - 1}", True), None
        gpu = m.gpus[index]
        return Check("run device", PASS, f"run.device {cfg.run.device} -> cuda:{index} ({gpu.name})", "", True), gpu
    if device.type != "cpu":
        return Check("run device", FAIL, f"run.device {cfg.run.device}: solrl runs on cpu or cuda", "use auto, cpu, "
                                                                                                    "cuda or cuda:N",
                     True), None
    if real:
        return Check("run device", WARN, f"run.device {cfg.run.device} -> cpu: the {cfg.model.loader} model on a CPU "
                                         f"is "
                     "impractically slow (hours per iteration)", "run it on a machine with an NVIDIA GPU", True), None
    return Check("run device", PASS, f"run.device {cfg.run.device} -> cpu", "", True), None


def _gpus(m: Machine, run_gpu: GpuInfo | None) -> list[Check]:
    if not m.gpus:
        return [Check("gpus", PASS, "none visible to torch: runs use the CPU", "", False)]
    out = []
    for gpu in m.gpus:
        ok = hardware.supported(hardware.explore_precisions(gpu))
        out.append(Check(f"gpu cuda:{gpu.index}", PASS, f"{gpu.name}, compute capability "
                         f"{gpu.capability[0]}.{gpu.capability[1]}, {gpu.memory_gib:.0f} GiB; explore precisions here: "
                         f"{', '.join(ok)}", "", gpu == run_gpu))
    return out


def _transformer_engine(m: Machine, gpu: GpuInfo | None, requested: str | None) -> Check:
    """Reported, never needed: real NVFP4 runs through torchao (precision/nvfp4_gemm.py says why)."""
    if m.te.installed:
        parts = [f"Transformer Engine {m.te.version or '(version unknown)'}"]
        if gpu is not None:
            for kind in ("nvfp4", "fp8"):
                answer = hardware.te_support(kind, gpu)
                parts.append(f"{kind.upper()} on cuda:{gpu.index}: " + ("no check function found" if answer is None else
                             "yes" if answer[0] else f"no ({answer[1]})"))
        else:
            parts.append("no GPU to ask about NVFP4/FP8")
        return Check("transformer engine", PASS, "; ".join(parts), "", False)
    return Check("transformer engine", PASS, m.te.reason + " (optional: solrl's explore kernels do not use it; real "
                 "NVFP4 runs through torchao)", "", False)


def _dist_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _library(name: str) -> Check:
    version = _dist_version(name)
    if version is None:
        return Check(name, FAIL, "not installed (a core dependency of solrl)", f"pip install {name}  (or reinstall "
                                                                               f"solrl)", True)
    return Check(name, PASS, f"{name} {version}", "", True)


def _major(version: str | None) -> int:
    try:
        return int((version or "0").split(".")[0])
    except ValueError:
        return 0


def _combinations(rewards: set[str]) -> list[Check]:
    out = []
    ir, tf = _dist_version("image-reward"), _dist_version("transformers")
    if ir is not None:
        if _major(tf) >= 5:
            detail = (f"image-reward {ir} does not import as published under transformers {tf}: handled by solrl's "
                      f"compat "
                      "layer (solrl_core/rewards/compat.py), in memory, no site-packages edit")
        else:
            detail = f"image-reward {ir} with transformers {tf}: works as published"
        out.append(Check("image-reward + transformers", PASS, detail, "", "imagereward" in rewards))
    st = _dist_version("setuptools")
    if st is not None and importlib.util.find_spec("pkg_resources") is None:
        out.append(Check("setuptools", PASS, f"setuptools {st} has no pkg_resources: fine, nothing solrl loads needs "
                                             f"it "
                         "(no downgrade needed)", "", False))
    return out


def matching_torchvision(torch_version: str) -> str | None:
    """The torchvision release built for a torch 2.x release: 0.(minor + 15).patch."""
    parts = torch_version.split("+")[0].split(".")
    try:
        major, minor, patch = int(parts[0]), int(parts[1]), int(parts[2]) if len(parts) > 2 else 0
    except (ValueError, IndexError):
        return None
    return f"0.{minor + 15}.{patch}" if major == 2 else None


def _torchvision(rewards: set[str]) -> Check:
    import torch

    needing = torchvision_rewards()
    needed = bool(rewards & set(needing))
    bad = FAIL if needed else WARN
    base = torch.__version__.split("+")[0]
    tv = matching_torchvision(torch.__version__)
    pin = (f'pip install "torch==={base}" "torchvision=={tv}"' if tv else "install the torchvision release built for "
                                                                          "this torch")
    if importlib.util.find_spec("torchvision") is None:
        return Check("torchvision", bad, f"not installed (needed by {', '.join(needing)})",
                     f"{pin}  (or pip install \"solrl[rewards]\" with a matching torch)", needed)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import torchvision
    except Exception as exc:  # noqa: BLE001 - an ABI mismatch surfaces as RuntimeError/OSError/ImportError
        cpu = "+cpu" in torch.__version__
        why = (f"torch {torch.__version__} is a CPU-only (+cpu) wheel and PyPI's torchvision is built against PyPI's "
               "CUDA torch, so the two do not import together; PyPI's CUDA torch runs on a CPU too" if cpu else
               f"this torchvision was not built for torch {torch.__version__}")
        return Check("torchvision", bad, f"does not import next to torch {torch.__version__} "
                     f"({type(exc).__name__}: {hardware._first_line(exc)}): {why}", pin, needed)
    return Check("torchvision", PASS,
                 f"torchvision {torchvision.__version__} imports next to torch {torch.__version__}", "",
                 needed)


def _reward_backends(rewards: set[str], only_needed: bool = False) -> list[Check]:
    out = []
    for backend, serves in backends().items():  # one row for the rewards that share a backend
        label, needed = ", ".join(serves), bool(rewards & set(serves))
        if only_needed and not needed:
            continue
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                backend.probe()
        except Exception as exc:  # noqa: BLE001 - any import failure is the answer
            out.append(Check(f"reward backend {label}", FAIL if needed else WARN,
                             f"does not import: {type(exc).__name__}: {hardware._first_line(exc)}", backend.install,
                             needed))
        else:
            out.append(Check(f"reward backend {label}", PASS, "imports", "", needed))
    return out
