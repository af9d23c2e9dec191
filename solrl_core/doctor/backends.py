"""The doctor's "explore backends" row: the kernel each explore precision would run on this machine's
GPU (or a simulated one: `solrl doctor --gpu-capability 10.0`), and whether a speed figure exists for
it there (precision/backends.py), and the kernel of explore.fp8_attention (precision/fp8_attention.py).
Information only: nothing here decides whether a run can start."""

from __future__ import annotations

from solrl_core.doctor.check import PASS, Check
from solrl_core.precision import fp8_attention, hardware
from solrl_core.precision.backends import Backend, backend_of
from solrl_core.precision.hardware import GpuInfo


def simulated_gpu(capability: str) -> GpuInfo:
    """A made-up GPU of compute capability 'MAJOR.MINOR' (e.g. '9.0', '10.0'), to plan for a GPU not here."""
    from solrl_core.errors import SolrlError

    try:
        major, minor = (int(part) for part in capability.split("."))
    except ValueError:
        raise SolrlError(f"--gpu-capability {capability!r} is not MAJOR.MINOR", "e.g. --gpu-capability 9.0 (Hopper) "
                         "or 10.0 (Blackwell)") from None
    return GpuInfo(0, f"a simulated GPU of compute capability {major}.{minor}", (major, minor), 0.0)


def backends_check(gpu: GpuInfo | None, fp8_backend: str, simulated: bool = False) -> Check:
    """One line per explore precision: its backend and whether it is measured on `gpu`, or why it
    does not run there."""
    where = ("the CPU (no speed figure on a CPU)" if gpu is None else f"{gpu.name}" if simulated else
             f"cuda:{gpu.index} (compute capability {gpu.capability[0]}.{gpu.capability[1]})")
    parts = []
    for precision, (ok, why) in hardware.explore_precisions(gpu).items():  # on the CPU the speed is said once, above
        parts.append(backend_of(precision, gpu, fp8_backend).describe(gpu is not None) if ok else f"{precision}: not "
                                                                                                  f"here ({why})")
    parts.append(attention_line(gpu))
    return Check("explore backends", PASS, f"on {where}: " + "; ".join(parts), "", False)


def attention_line(gpu: GpuInfo | None) -> str:
    """explore.fp8_attention's kernel on `gpu` (None: the CPU), from this machine's packages; no speed
    figure exists for it anywhere yet."""
    name, what = fp8_attention.backend(gpu.capability if gpu is not None else None)
    if not name:
        return f"fp8 attention: not here ({what})"
    return Backend("fp8 attention", name, what, "", gpu is not None).describe(gpu is not None)
