"""Processes against GPUs, the peak GPU memory ESTIMATE, and whether the explore precision runs here.
What a run would choose (its explore precision, whether its family explores at it, its copies) is
read from the plan that run would make (`planned`), never worked out again here."""

from __future__ import annotations

import dataclasses

from solrl_core.config.choices import EXPLORE_PRECISIONS
from solrl_core.config.schema import TINY_LOADERS, Config
from solrl_core.doctor.check import FAIL, PASS, WARN, Check, Machine
from solrl_core.plan.footprint import estimate_memory, model_size
from solrl_core.plan.plan import RunPlan
from solrl_core.precision import hardware
from solrl_core.precision.hardware import GpuInfo

# Where the doctor has no GPU to ask, a real model's needs are those of a run on this one (its memory
# unused: only the choices the plan makes by compute capability, auto's fp8 explore copy among them).
ASSUMED_GPU = GpuInfo(0, "a GPU of compute capability 9.0", (9, 0), 80.0)


def planned(cfg: Config, gpu: GpuInfo | None, requested: str | None = None) -> RunPlan:
    """The plan a one-process run of `cfg` makes on `gpu` (None: the CPU; a made-up GPU welcome) with
    explore.precision `requested` (`solrl doctor --explore-precision`; None or one no run knows: the
    config's), as one replica: the strategy check shows the sharded ones (doctor/strategy.py)."""
    import torch

    from solrl_core.plan.resolve import resolve_plan
    from solrl_core.runtime.device import resolve_dtype

    precision = requested if requested in set(EXPLORE_PRECISIONS) | set(hardware.PRECISIONS) else cfg.explore.precision
    asked = dataclasses.replace(cfg, explore=dataclasses.replace(cfg.explore, precision=precision),
                                distributed=dataclasses.replace(cfg.distributed, strategy="replicate"))
    device = torch.device("cuda", gpu.index) if gpu is not None else torch.device("cpu")
    return resolve_plan(asked, device, resolve_dtype(cfg.run.dtype, device)[0], gpu=gpu)


def _processes(nproc: int, m: Machine, gpu: GpuInfo | None) -> Check:
    if gpu is None:
        if nproc == 1:
            return Check("processes", PASS, "1 process on the CPU", "", True)
        return Check("processes", WARN, f"{nproc} processes on the CPU share its cores", "--nproc-per-node 1", True)
    n = len(m.gpus)
    if nproc <= n:
        return Check("processes", PASS, f"{nproc} process(es), {n} GPU(s): one GPU each", "", True)
    return Check("processes", FAIL, f"{nproc} processes asked for, but this machine has {n} GPU(s) (one per process)",
                 f"--nproc-per-node {n}", True)


def _fitting_precisions(cfg: Config, gpu: GpuInfo, dtype_name: str) -> str:
    """The explore precisions usable on this GPU whose estimate fits in its memory, as a fix hint."""
    usable = [p for p in hardware.supported(hardware.explore_precisions(gpu)) if p in hardware.IMPLEMENTED_EXPLORE]
    fits = [(p, estimate_memory(cfg, p, dtype_name).peak) for p in usable]
    fits = [f"--explore-precision {p} (estimate {peak:.0f} GiB{', no separate copy' if p == dtype_name else ''})"
            for p, peak in fits if peak <= gpu.memory_gib]
    if not fits:
        return "; no explore precision usable here fits by this estimate"
    return "; fits here by this estimate: " + ", ".join(fits)


def _memory_without_gpu(cfg: Config, requested: str | None) -> Check:
    """No GPU here: a real model still gets the estimate of a bf16 GPU run (explore copy as asked,
    fp8 for auto), so its memory needs are known before a GPU is chosen."""
    check = _memory(cfg, None, requested)
    if cfg.model.loader in TINY_LOADERS:
        return check
    gpu_run = planned(cfg, ASSUMED_GPU, requested if requested in hardware.IMPLEMENTED_EXPLORE else "auto")
    precision = gpu_run.machine.explore_precision
    est = estimate_memory(cfg, precision, gpu_run.full_precision)
    detail = (f"{check.detail}; on a GPU in {gpu_run.full_precision} with a {precision} explore copy: estimate "
              f"{est.peak:.1f} GiB ({model_size(cfg).label}, approximate): policy {est.policy:.1f} + explore copy "
              f"{est.explore_copy:.1f} + vae {est.vae:.1f} + max(text encoders {est.text_encoders:.1f}, activations "
              f"{est.activations:.1f} for micro-batch {cfg.optimizer.micro_batch}) + {est.overhead:.1f} overhead")
    return dataclasses.replace(check, detail=detail)


def _memory(cfg: Config, gpu: GpuInfo | None, requested: str | None, plan: RunPlan | None = None) -> Check:
    """`plan`: the run's own (its preflight), else the one a run of `cfg` would make on `gpu`."""
    if gpu is None:
        return Check("memory estimate", PASS, "skipped: no GPU (the run uses the CPU's memory)", "", False)
    plan = plan or planned(cfg, gpu, requested or "auto")
    machine, dtype_name = plan.machine, plan.full_precision
    est = estimate_memory(cfg, machine.explore_precision, dtype_name, machine.checkpointing, machine.rollout_copy,
                          machine.update_compile)
    detail = (f"estimate {est.peak:.1f} GiB of {gpu.memory_gib:.0f} GiB on cuda:{gpu.index} ({model_size(cfg).label}, "
              f"approximate): policy {est.policy:.1f} + explore copy {est.explore_copy:.1f} "
              f"({machine.explore_precision}) + rollout copy {est.rollout_copy:.1f} + vae {est.vae:.1f} + max(text "
              f"encoders {est.text_encoders:.1f}, activations {est.activations:.1f} for micro-batch "
              f"{cfg.optimizer.micro_batch}, gradient checkpointing {'on' if machine.checkpointing else 'off'}) + "
              f"{est.overhead:.1f} overhead; rollout copy: {machine.rollout_copy_why}; torch.compile: "
              + ", ".join(f"{name} {'on' if on else 'off'}" for name, on in (
                  ("explore copy", machine.explore_compile), ("rollout copy", machine.rollout_compile),
                  ("update", machine.update_compile)))
              + f" (the copies in mode {cfg.run.compile_mode}); {machine.tf32}")
    fix = ("lower optimizer.micro_batch (--set optimizer.micro_batch=N), use a GPU with more memory, or an explore "
           "precision with a smaller copy")
    if est.peak > gpu.memory_gib:
        return Check("memory estimate", FAIL, detail, fix + _fitting_precisions(cfg, gpu, dtype_name), True)
    if est.peak > 0.9 * gpu.memory_gib:
        return Check("memory estimate", WARN, detail + " (within 10%)", fix, True)
    return Check("memory estimate", PASS, detail, "", True)


def _explore(cfg: Config, gpu: GpuInfo | None, requested: str | None, plan: RunPlan | None = None) -> Check:
    """`plan`: the run's own (its preflight), else the one a run of `cfg` would make on `gpu` at `requested`."""
    requested = requested or cfg.explore.precision
    known = list(dict.fromkeys((*EXPLORE_PRECISIONS, *hardware.PRECISIONS)))
    if requested not in known:
        return Check("explore precision", FAIL, f"unknown explore precision '{requested}'", f"choose one of: "
                                                                                            f"{', '.join(known)}",
                     True)
    plan = plan or planned(cfg, gpu, requested)
    family, uses, resolved = plan.family, plan.low_precision, plan.machine.explore_precision
    auto_why = plan.machine.explore_why if requested == "auto" else ""
    precisions = hardware.explore_precisions(gpu)
    ok, why = precisions.get(resolved, (False, "not a precision solrl knows"))
    where = f"cuda:{gpu.index} ({gpu.name})" if gpu is not None else "the CPU"
    name = requested if resolved == requested else f"{requested} -> {resolved}"
    unused = "" if uses else f"; the {family} family does not use it (its rollouts run at full precision)"
    here = hardware.supported(precisions)
    if not ok:
        usable = [p for p in here if p in hardware.IMPLEMENTED_EXPLORE] or here
        fix = f"this machine supports: {', '.join(here)}; use --explore-precision {usable[0]}"
        return Check("explore precision", FAIL if uses else WARN, f"{name} is not supported on {where}: {why}{unused}",
                     fix, uses)
    if resolved not in hardware.IMPLEMENTED_EXPLORE:
        return Check("explore precision", WARN, f"{name} runs on {where} ({why}), but this solrl's rollouts do not use "
                     f"it yet (implemented: {', '.join(hardware.IMPLEMENTED_EXPLORE)}){unused}",
                     "use --explore-precision fp8 (Ada, Hopper, Blackwell) or nvfp4-emulated for now", uses)
    chosen = f" ({auto_why})" if auto_why else ""
    return Check("explore precision", PASS, f"{name} on {where}: {why}{chosen}{unused}", "", uses)
